"""Passkey retrieval of per-head KV policies on prompt families they were not chosen on (SmolLM2-135M-Instruct).

Calibration (what ``headwise.kv_policy`` and ``headwise kv-policy`` rank heads on by default): passkey prompts of
512 tokens in the *filler* haystack through the chat template, seed 0 (``scores`` measures every family's, seed 0;
a variant calibrated on several families takes the mean of theirs). Three sets of prompts never overlap:

  calibration   512 tokens, seed 0, the variant's calibration families;
  tuning        ``--length`` tokens, seed 500 + family index, the first key at each depth, on the filler and numbers
                families only (``TUNE_FAMILIES``): the variants (``VARIANTS``: calibration families, the share of the
                streaming heads' budget that sink + window take, the sink) are compared here and the default chosen;
  evaluation    six families — three haystacks (``filler`` repeated sentences, ``text`` running WikiText-2 from the
                last 10% of valid.txt, ``numbers`` a code-like list of assignments) × with / without the chat
                template — keys at five depths (0, .25, .5, .75, 1), seed 1000 + family index (2 keys per depth at
                2k, 1 at 8k: the first run), more keys from seed 3000 + family index. The ``text`` haystack is never
                seen before evaluation; the other families only with other keys and lengths.

Arms at each length ``L`` (budget ``b`` of the full cache's bytes at ``L`` tokens):
  full            every head keeps every token;
  VARIANT@b       the top ``retrieval`` heads of the variant's calibration full, the others sink + window
                  (``window_share · b · L``), as many full heads as fit ``b``;
  policy@b        ``kv_policy(model, tokenizer, b, L)`` with the library's own calibration, checked equal to
                  ``DEFAULT``'s policy and stored under that variant's name;
  streaming@b     StreamingLLM: every head sink 4 + window ``b·L − 4`` (the same bytes).

Every evaluation prompt is prefilled in chunks through the arm's cache and decoded greedily
(``headwise.kvcache.passkey.greedy_continuation``: the answers ``generate()`` gives, without a ``[T, T]`` mask);
tuning prompts are teacher forced (``key_loss``: the key's NLL and whether greedy decoding finds it, one pass).
Resumable: every answer is saved as it comes, by key; an answered prompt is never run again.

  python experiments/kv_policy_families.py scores                 # calibration scores, per-family rankings
  python experiments/kv_policy_families.py tune --arms full,v0@0.5,fn4@0.5,v0-w50@0.5,v0@0.375,fn4@0.375
  python experiments/kv_policy_families.py eval --length 2048 --keys 3 --arms full,policy@0.5
  python experiments/kv_policy_families.py eval --length 2048 --keys 3 --first-keys 1 --arms streaming@0.5
  python experiments/kv_policy_families.py eval --length 2048 --keys 3 --first-keys 1 \
      --arms policy@0.25,policy@0.375,policy@0.625,policy@0.75          # the budget–retrieval curve
  python experiments/kv_policy_families.py eval --length 8192 --keys 1 --arms full,policy@0.5
  python experiments/kv_policy_families.py table                  # markdown tables from the results
  python experiments/kv_policy_families.py eval --quick           # smoke run: 2 families, 512 tokens, 1 key
"""

from __future__ import annotations

import argparse
import fcntl
import random
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from common import RESULTS, WIKITEXT, data_file, load_results, merge_results

from headwise.compat import CACHE
from headwise.kvcache import (KVPolicy, ScoreConfig, apply_kv_policy, full_heads_for_budget, head_scores,
                              kv_policy, policy_cache, policy_of, rank_kv_heads, remove_kv_policy, streaming)
from headwise.kvcache.choose import default_window
from headwise.kvcache.passkey import HAYSTACKS, Passkey, PromptFamily, family_prompts, passkey_accuracy
from headwise.kvcache.scores import HeadScores

OUT = RESULTS / "kv_policy_families.json"
DEPTHS = [0.0, 0.25, 0.5, 0.75, 1.0]
FAMILIES = [f"{h}-{t}" for h in HAYSTACKS for t in ("chat", "raw")]
CALIBRATION = "filler-chat"  # the calibration family of the first default (ScoreConfig.families=("filler",))
EVAL_SEED = 1000  # evaluation prompts: seed EVAL_SEED + family index; more keys from MORE_SEED + family index
MORE_SEED = 3000
FIRST_KEYS = {2048: 2}  # keys per depth of the first evaluation set (seed EVAL_SEED) at each length; 1 elsewhere
TUNE_SEED = 500  # tuning prompts: seed TUNE_SEED + family index (below 1000: never an evaluation prompt)
TUNE_FAMILIES = ["filler-chat", "filler-raw", "numbers-chat", "numbers-raw"]  # the text haystack stays held out
SINK = 4


@dataclass(frozen=True)
class Variant:
    """One way to choose the policy at a budget: rank KV heads by ``retrieval`` measured on the calibration
    ``families`` (512 tokens, seed 0, the mean over their prompts), keep the top ones full and give the others
    ``streaming(sink, window)`` with ``sink + window = window_share · budget · length`` (the library's rule: 3/4)."""

    families: tuple[str, ...]
    window_share: float = 0.75
    sink: int = SINK

    def window(self, budget: float, length: int) -> int:
        return int(self.window_share * budget * length) - self.sink


SELF_CONTAINED = ("filler-chat", "filler-raw", "numbers-chat", "numbers-raw")  # no text needed to build them
VARIANTS = {
    "v0": Variant(("filler-chat",)),  # the default before issue 31's retrieval run
    "v0-w50": Variant(("filler-chat",), 0.5),
    "fn4": Variant(SELF_CONTAINED),
    "fn4-w50": Variant(SELF_CONTAINED, 0.5),
    "fn4-s16": Variant(SELF_CONTAINED, 0.75, 16),
}
DEFAULT = "v0"  # the variant the library's defaults give (checked by ``policy@B`` arms before they run)


def wikitext_split(path: Path) -> tuple[str, str]:
    """First 90% of the non-empty lines (calibration), last 10% (evaluation): the project's fixed split."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    cut = int(len(lines) * 0.9)
    return "\n".join(lines[:cut]), "\n".join(lines[cut:])


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """One writer at a time (two eval jobs may run side by side)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / (path.name + ".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def log(message: str) -> None:
    print(time.strftime("%H:%M:%S"), message, flush=True)


def stored_scores(results: dict, families: tuple[str, ...] = (CALIBRATION,)) -> HeadScores:
    """The scores of ``families`` from the scores step: the mean of each family's (every family has the same number
    of prompts, so this is what ``head_scores`` with ``ScoreConfig(families=families)`` gives)."""
    rows = [results["calibration"][family] for family in families]
    names = rows[0]["scores"]["per_query_head"]
    return HeadScores({k: sum(torch.tensor(r["scores"]["per_query_head"][k]) for r in rows) / len(rows)
                       for k in names}, rows[0]["kv_heads"])


def run_scores(args, model, tokenizer) -> None:
    """Head scores on every family's calibration prompts (512 tokens, seed 0, 5 depths × 1 key; text from the first
    90% of valid.txt); the kept heads at half the bytes at 2k and 8k and their Jaccard overlap with the default
    (``filler-chat``) choice: does the ranking depend on the family it was measured on?"""
    calibration_text, _ = wikitext_split(args.data)
    rows = {}
    for family in FAMILIES:
        start, cpu = time.time(), time.process_time()
        scores = head_scores(model, tokenizer, ScoreConfig(families=(family,), seed=0), progress=False,
                             haystack_text=calibration_text)
        rows[family] = {"scores": scores.to_dict(), "kv_heads": scores.kv_heads,
                        "seconds": round(time.time() - start, 1), "cpu_seconds": round(time.process_time() - cpu, 1)}
        log(f"scores {family} {rows[family]['seconds']} s")
    total = sum(rows[CALIBRATION]["kv_heads"])
    for length in (2048, 8192):
        n_full = full_heads_for_budget(total, 0.5, length, SINK, default_window(0.5, length, SINK))
        for family in FAMILIES:
            scores = HeadScores({k: torch.tensor(v) for k, v in rows[family]["scores"]["per_query_head"].items()},
                                rows[family]["kv_heads"])
            kept = set(rank_kv_heads(scores, "retrieval")[:n_full])
            rows[family].setdefault("full_heads", {})[str(length)] = sorted(map(list, kept))
    for family in FAMILIES:
        for length, kept in rows[family]["full_heads"].items():
            base = set(map(tuple, rows[CALIBRATION]["full_heads"][length]))
            mine = set(map(tuple, kept))
            rows[family].setdefault("jaccard_vs_calibration", {})[length] = round(
                len(base & mine) / max(len(base | mine), 1), 3)

    def update(results: dict) -> None:
        results["calibration"] = rows
        results["model"] = "smollm2-135m (SmolLM2-135M-Instruct, 30 layers x 3 KV heads, float32, CPU)"

    with locked(args.out):
        merge_results(args.out, update)


_LIBRARY_SCORES: dict[str, HeadScores] = {}


def arm_policy(name: str, model, tokenizer, results: dict, length: int) -> tuple[str, KVPolicy]:
    """``(arm, policy)`` for ``full``, ``streaming@b`` (every head sink 4 + window ``b·L − 4``), ``VARIANT@b`` (see
    ``VARIANTS``) or ``policy@b``: the library's default (``kv_policy(model, tokenizer, b, L)`` with its own
    calibration), checked equal to the ``DEFAULT`` variant's policy and stored under that variant's name."""
    if name == "full":
        return name, KVPolicy.uniform(model)
    kind, _, budget = name.partition("@")
    budget = float(budget)
    if kind == "streaming":
        return name, KVPolicy.uniform(model, streaming(SINK, int(budget * length) - SINK))
    if kind == "policy":
        if "scores" not in _LIBRARY_SCORES:
            _LIBRARY_SCORES["scores"] = head_scores(model, tokenizer, ScoreConfig(), progress=False)
        library = kv_policy(model, tokenizer, budget, length, scores=_LIBRARY_SCORES["scores"], progress=False)[0]
        arm, policy = arm_policy(f"{DEFAULT}@{budget:g}", model, tokenizer, results, length)
        if library != policy:
            raise SystemExit(f"the library's default policy at {budget:g} is not variant {DEFAULT!r}'s: set DEFAULT")
        return arm, policy
    if kind in VARIANTS:
        variant = VARIANTS[kind]
        scores = stored_scores(results, variant.families)
        return f"{kind}@{budget:g}", kv_policy(model, tokenizer, budget, length, variant.sink,
                                                window=variant.window(budget, length), scores=scores,
                                                ranking="retrieval", progress=False)[0]  # the stored scores' own
    raise SystemExit(f"unknown arm {name!r}: full, streaming@B, policy@B or one of {', '.join(VARIANTS)} @B")


def key_loss(model, prompt: Passkey, prefill_chunk: int) -> tuple[float, bool]:
    """Teacher-forced through the model's cache (its policy's when it has one): the mean negative log-likelihood of the
    key's tokens after the prompt, and whether every one of them is the arg-max (what greedy decoding finds)."""
    from transformers.cache_utils import DynamicCache

    cache = policy_cache(model) if policy_of(model) is not None else DynamicCache()
    answer = prompt.answer_ids
    ids = torch.cat([prompt.ids, answer[:-1]])[None]
    head = len(prompt.ids) - 1  # the last prompt token goes with the answer: its logits predict the first digit
    with torch.no_grad():
        for start in range(0, head, prefill_chunk):
            model(input_ids=ids[:, start: min(start + prefill_chunk, head)], use_cache=True, logits_to_keep=1,
                  **{CACHE: cache})
        logits = model(input_ids=ids[:, head:], use_cache=True, **{CACHE: cache}).logits[0].float()  # [n, vocab]
    nll = -logits.log_softmax(-1)[torch.arange(len(answer)), answer].mean()
    return round(float(nll), 4), bool((logits.argmax(-1) == answer).all())


def run_tune(args, model, tokenizer) -> None:
    """Tuning prompts (seed TUNE_SEED + family index, the first key at each depth, ``--length``) on the families the
    variants may be chosen on (``TUNE_FAMILIES``, no ``text`` haystack): per arm, the key's teacher-forced NLL and
    whether greedy decoding finds it."""
    results = load_results(args.out)
    families = args.families.split(",") if args.families else TUNE_FAMILIES
    for family in families:
        prompts = family_prompts(tokenizer, PromptFamily.parse(family), args.length, DEPTHS, 1,
                                 TUNE_SEED + FAMILIES.index(family))
        for name in args.arms.split(","):
            arm, policy = arm_policy(name, model, tokenizer, results, args.length)
            done = load_results(args.out).get("tune", {}).get(str(args.length), {}).get(family, {}).get(arm)
            if done and done["keys"] == [p.key for p in prompts]:
                continue
            apply_kv_policy(model, policy)
            rows = [key_loss(model, p, args.prefill_chunk) for p in prompts]
            remove_kv_policy(model)
            row = {"nll": [r[0] for r in rows], "found": [r[1] for r in rows], "keys": [p.key for p in prompts],
                   "full_heads": len(policy.full_heads()), "kv_fraction": round(policy.kv_fraction(args.length), 4)}

            def update(results: dict, family=family, arm=arm, row=row) -> None:
                results.setdefault("tune", {}).setdefault(str(args.length), {}).setdefault(family, {})[arm] = row

            with locked(args.out):
                merge_results(args.out, update)
            log(f"tune {args.length} {family} {arm}: {sum(row['found'])}/{len(prompts)} "
                f"nll {sum(row['nll']) / len(prompts):.3f}")


def eval_prompts(tokenizer, family: str, length: int, keys: int, text: str) -> list[Passkey]:
    """``keys`` prompts per depth, depth-major: first the set of seed EVAL_SEED + family index (``FIRST_KEYS[length]``
    keys per depth, what the first run measured), then more keys from seed MORE_SEED + family index."""
    first = FIRST_KEYS.get(length, 1)
    index, parsed = FAMILIES.index(family), PromptFamily.parse(family)
    prompts = family_prompts(tokenizer, parsed, length, DEPTHS, min(keys, first), EVAL_SEED + index, text)
    if keys > first:
        prompts += family_prompts(tokenizer, parsed, length, DEPTHS, keys - first, MORE_SEED + index, text)
    return sorted(prompts, key=lambda p: DEPTHS.index(p.depth))  # stable: the first set's keys first at each depth


def run_eval(args, model, tokenizer) -> None:
    results = load_results(args.out)
    if "calibration" not in results:
        raise SystemExit("run the scores step first")
    _, evaluation_text = wikitext_split(args.data)
    families = args.families.split(",") if args.families else FAMILIES
    for family in families:
        prompts = eval_prompts(tokenizer, family, args.length, args.keys, evaluation_text)
        if args.first_keys:  # the first keys at each depth of the same prompts
            prompts = [p for d in DEPTHS for p in [q for q in prompts if q.depth == d][:args.first_keys]]
        tokens = [len(p.ids) for p in prompts]

        def record(results: dict, family=family, prompts=prompts) -> None:  # the prompts in order: [key, depth]
            rows = results.setdefault("prompts", {}).setdefault(str(args.length), {}).setdefault(family, [])
            rows += [[p.key, p.depth] for p in prompts if p.key not in {k for k, _ in rows}]

        with locked(args.out):
            merge_results(args.out, record)
        for name in [a for a in args.arms.split(",") if a]:  # --arms "": record the prompt set only
            arm, policy = arm_policy(name, model, tokenizer, results, args.length)
            done = load_results(args.out).get("eval", {}).get(str(args.length), {}).get(family, {}).get(arm) or {}
            answered = dict(zip(done.get("keys", []), done.get("answers", [])))  # every answer so far, by key
            todo = [p for p in prompts if p.key not in answered]
            if not todo:
                continue
            apply_kv_policy(model, policy)
            start, cpu = time.time(), time.process_time()
            for prompt in todo:
                answered[prompt.key] = passkey_accuracy(model, tokenizer, [prompt], progress=False,
                                                        prefill_chunk=args.prefill_chunk)["answers"][0]
                depth_of = {p.key: p.depth for p in prompts} | dict(zip(done.get("keys", []),
                                                                         done.get("depths", [])))
                keys = list(answered)
                found = [answered[k].strip() == k for k in keys]
                depths = [depth_of.get(k) for k in keys]
                row = {"correct": sum(found), "prompts": len(keys),
                       "complete": all(p.key in answered for p in prompts),
                       "by_depth": {str(d): sum(f for f, e in zip(found, depths) if e == d) for d in DEPTHS},
                       "answers": [answered[k] for k in keys], "keys": keys, "depths": depths,
                       "policy": policy.describe(), "full_heads": len(policy.full_heads()),
                       "kv_fraction": round(policy.kv_fraction(args.length), 4),
                       "kv_fraction_at_prompt": round(sum(policy.kv_fraction(t) for t in tokens) / len(tokens), 4),
                       "tokens": [min(tokens), max(tokens)], "seconds": round(time.time() - start, 1),
                       "cpu_seconds": round(time.process_time() - cpu, 1), "threads": torch.get_num_threads(),
                       "prefill_chunk": args.prefill_chunk}

                def update(results: dict, family=family, arm=arm, row=row) -> None:
                    results.setdefault("eval", {}).setdefault(str(args.length), {}).setdefault(family, {})[arm] = row

                with locked(args.out):
                    merge_results(args.out, update)
            remove_kv_policy(model)
            log(f"{args.length} {family} {arm}: {row['correct']}/{row['prompts']} {row['by_depth']} "
                f"({row['seconds']} s)")


def counted(row: dict | None, prompts: list[list]) -> dict | None:
    """``row``'s answers on ``prompts`` (``[key, depth]``) it answered: correct, prompts, of (planned), by depth."""
    if row is None:
        return None
    answers = dict(zip(row["keys"], row["answers"]))
    ran = [(k, d) for k, d in prompts if k in answers]
    if not ran:
        return None
    found = [(answers[k].strip() == k, d) for k, d in ran]
    return {"correct": sum(f for f, _ in found), "prompts": len(ran), "of": len(prompts), "keys": {k for k, _ in ran},
            "by_depth": [sum(f for f, e in found if e == d) for d in DEPTHS]}


def cell(row: dict | None, depths: bool = False) -> str:
    if row is None:
        return "—"
    text = f"{row['correct']}/{row['prompts']}" + ("" if row["prompts"] == row["of"] else f" (of {row['of']})")
    return text + (" (" + " / ".join(map(str, row["by_depth"])) + ")" if depths else "")


def gap(row: dict | None, full_row: dict | None, prompts: list[list]) -> str:
    """Stored ``row`` − the full cache's, in points, on the prompts of ``prompts`` both answered."""
    if row is None or full_row is None:
        return "—"
    both = [p for p in prompts if p[0] in row["keys"] and p[0] in full_row["keys"]]
    if not both:
        return "—"
    return f"{100 * (counted(row, both)['correct'] - counted(full_row, both)['correct']) / len(both):+.0f} pts"


def tune_table(results: dict) -> list[str]:
    lines = []
    for length, by_family in results.get("tune", {}).items():
        families = [f for f in TUNE_FAMILIES if f in by_family]
        arms = list(dict.fromkeys(a for f in families for a in by_family[f]))
        lines += [f"\n**Tuning prompts, {int(length):,} tokens** (seed {TUNE_SEED} + family index, the first key at "
                  "each depth; keys found by greedy decoding / mean teacher-forced NLL of the key's tokens)\n",
                  "| arm | full heads | " + " | ".join(families) + " | all: found | all: mean NLL |",
                  "|---|---|" + "---|" * (len(families) + 2)]
        for arm in arms:
            rows = [by_family[f].get(arm) for f in families]
            done = [r for r in rows if r]
            found = sum(sum(r["found"]) for r in done)
            nll = [v for r in done for v in r["nll"]]
            lines.append(f"| {arm} | {done[0]['full_heads']} | " + " | ".join(
                "—" if r is None else f"{sum(r['found'])}/{len(r['found'])}, {sum(r['nll']) / len(r['nll']):.3f}"
                for r in rows) + f" | {found}/{len(nll)} | {sum(nll) / len(nll):.3f} |")
    return lines


def table(results: dict) -> str:
    """Markdown: the tuning table, one table per length (family × arm, by depth), then the budget curve at 2k."""
    lines = tune_table(results)
    default = f"{DEFAULT}@0.5"
    tuned = {family for by_family in results.get("tune", {}).values() for family in by_family}
    for length, by_family in sorted(results.get("eval", {}).items(), key=lambda kv: int(kv[0])):
        main = ["full", default] + (["v0@0.5"] if DEFAULT != "v0" else []) + ["streaming@0.5"]
        titles = {"full": "full cache", "v0@0.5": "earlier default (v0), half the bytes",
                  "streaming@0.5": "StreamingLLM, half the bytes"} | {default: f"default ({DEFAULT}), half the bytes"}
        lines += [f"\n**{int(length):,} tokens** (passkeys found; by depth 0 / .25 / .5 / .75 / 1; "
                  "\"of N\": N planned, fewer run)\n",
                  "| family | held out | " + " | ".join(titles[a] for a in main) + " | default − full |",
                  "|---|---|" + "---|" * (len(main) + 1)]
        for family in FAMILIES:
            rows = by_family.get(family, {})
            prompts = results.get("prompts", {}).get(length, {}).get(family, [])
            got = {a: counted(rows.get(a), prompts) for a in main}
            held = ("new keys (calibration family)" if family in VARIANTS[DEFAULT].families
                    else "new keys (tuning family)" if family in tuned
                    else "new family" if not family.startswith("text") else "new family and haystack")
            lines.append(f"| {family} | {held} | " + " | ".join(cell(got[a], True) for a in main)
                         + f" | {gap(rows.get(default), rows.get('full'), prompts)} |")
        budgets = sorted({float(arm.split("@")[1]) for rows in by_family.values() for arm in rows
                          if arm.startswith(DEFAULT + "@")})
        if len(budgets) > 1:
            lines += [f"\n**Budget–retrieval curve at {int(length):,} tokens** (the default policy at each budget, "
                      "full heads and window in the header; on the first key at each depth)\n"]
            total = sum(results["calibration"][CALIBRATION]["kv_heads"])
            variant = VARIANTS[DEFAULT]
            header = [f"{b:g} ({full_heads_for_budget(total, b, int(length), variant.sink, variant.window(b, int(length)))}"
                      f" full, w {variant.window(b, int(length))})" for b in budgets]
            lines += ["| family | full cache | " + " | ".join(header) + " |", "|---|---|" + "---|" * len(budgets)]
            for family in FAMILIES:
                rows = by_family.get(family, {})
                prompts = results.get("prompts", {}).get(length, {}).get(family, [])
                first = [p for d in DEPTHS for p in [q for q in prompts if q[1] == d][:1]]
                lines.append(f"| {family} | {cell(counted(rows.get('full'), first))} | "
                             + " | ".join(cell(counted(rows.get(f"{DEFAULT}@{b:g}"), first)) for b in budgets) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["scores", "tune", "eval", "table"])
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--keys", type=int, default=2, help="keys per depth (5 depths)")
    parser.add_argument("--arms", default="full,policy@0.5,streaming@0.5")
    parser.add_argument("--families", default=None, help=f"comma-separated (default all: {','.join(FAMILIES)})")
    parser.add_argument("--first-keys", type=int, default=None,
                        help="evaluate only the first N of the --keys keys at each depth (the same prompts, fewer)")
    parser.add_argument("--prefill-chunk", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data", type=Path, default=None, help=f"default: shared/data/{WIKITEXT}")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 512 tokens, 1 key, filler-chat and numbers-raw, into a scratch file in the "
                             "temporary folder")
    args = parser.parse_args()
    if args.quick:
        args.length, args.keys, args.families = 512, 1, "filler-chat,numbers-raw"
        args.out = Path(tempfile.gettempdir()) / "kv_policy_families_quick.json"
    if args.step == "table":
        print(table(load_results(args.out)))
        return
    args.data = data_file(args.data, WIKITEXT)
    torch.set_num_threads(args.threads)
    random.seed(0)
    torch.manual_seed(0)
    import headwise

    model, tokenizer = headwise.load_model("smollm2-135m", task="lm")
    model.eval()
    if args.step == "scores" or (args.quick and "calibration" not in load_results(args.out)):
        run_scores(args, model, tokenizer)
    if args.step == "eval":
        run_eval(args, model, tokenizer)
    if args.step == "tune":
        run_tune(args, model, tokenizer)


if __name__ == "__main__":
    sys.exit(main())
