"""Passkey retrieval of per-head KV policies on prompt families they were not chosen on (SmolLM2-135M-Instruct).

Calibration (what ``headwise.kv_policy`` and ``headwise kv-policy`` rank heads on by default): passkey prompts of
512 tokens in the *filler* haystack through the chat template, seed 0. Evaluation: six families — three haystacks
(``filler`` repeated sentences, ``text`` running WikiText-2 from the last 10% of valid.txt, ``numbers`` a code-like
list of assignments) × with / without the chat template — keys at five depths (0, .25, .5, .75, 1), seeds 1000+
(new keys; for ``filler-chat`` that is the only thing held out, the five others are new families).

Arms at each length ``L`` (budget ``b`` of the full cache's bytes at ``L`` tokens):
  full            every head keeps every token;
  policy@b        ``kv_policy(model, tokenizer, b, L)`` with the calibration's scores: the top ``retrieval`` heads
                  full, the others sink 4 + the default window ``3/4·b·L − 4``;
  streaming@b     StreamingLLM: every head sink 4 + window ``b·L − 4`` (the same bytes).

Every prompt is prefilled in chunks through the arm's cache and decoded greedily
(``headwise.kvcache.passkey.greedy_continuation``: the answers ``generate()`` gives, without a ``[T, T]`` mask).
Cells are resumable: every prompt's answer is saved as it comes; a cell (length, family, arm) already
complete in the results file is skipped, one cut short goes on after its last answer.

  python experiments/kv_policy_families.py scores                 # calibration scores, per-family rankings
  python experiments/kv_policy_families.py eval --length 2048 --keys 2 --arms full,policy@0.5,streaming@0.5
  python experiments/kv_policy_families.py eval --length 8192 --keys 1 --arms full,policy@0.5,streaming@0.5
  python experiments/kv_policy_families.py eval --length 2048 --keys 2 \
      --arms policy@0.25,policy@0.375,policy@0.625,policy@0.75              # the budget–retrieval curve
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
from pathlib import Path
from typing import Iterator

import torch

from common import RESULTS, WIKITEXT, data_file, load_results, merge_results

from headwise.kvcache import (KVPolicy, ScoreConfig, apply_kv_policy, full_heads_for_budget, head_scores,
                              kv_policy, rank_kv_heads, remove_kv_policy, streaming)
from headwise.kvcache.choose import default_window
from headwise.kvcache.passkey import HAYSTACKS, PromptFamily, family_prompts, passkey_accuracy
from headwise.kvcache.scores import HeadScores

OUT = RESULTS / "kv_policy_families.json"
DEPTHS = [0.0, 0.25, 0.5, 0.75, 1.0]
FAMILIES = [f"{h}-{t}" for h in HAYSTACKS for t in ("chat", "raw")]
CALIBRATION = "filler-chat"  # the CLI's default calibration family (ScoreConfig.families=("filler",), a chat model)
EVAL_SEED = 1000
SINK = 4


def wikitext_split(path: Path) -> tuple[str, str]:
    """First 90% of the non-empty lines (calibration), last 10% (evaluation): the project's fixed split."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    cut = int(len(lines) * 0.9)
    return "\n".join(lines[:cut]), "\n".join(lines[cut:])


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """One writer at a time (two eval jobs may run side by side)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(Path(tempfile.gettempdir()) / (path.name + ".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def log(message: str) -> None:
    print(time.strftime("%H:%M:%S"), message, flush=True)


def stored_scores(results: dict, family: str = CALIBRATION) -> HeadScores:
    row = results["calibration"][family]
    return HeadScores({k: torch.tensor(v) for k, v in row["scores"]["per_query_head"].items()}, row["kv_heads"])


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


def arm_policy(name: str, model, tokenizer, scores: HeadScores, length: int) -> KVPolicy:
    """``full``, ``policy@b`` (kv_policy's defaults at budget b and ``length``) or ``streaming@b``."""
    if name == "full":
        return KVPolicy.uniform(model)
    kind, _, budget = name.partition("@")
    budget = float(budget)
    if kind == "policy":
        return kv_policy(model, tokenizer, budget, length, SINK, scores=scores, progress=False)[0]
    if kind == "streaming":
        return KVPolicy.uniform(model, streaming(SINK, int(budget * length) - SINK))
    raise SystemExit(f"unknown arm {name!r}: full, policy@BUDGET or streaming@BUDGET")


def run_eval(args, model, tokenizer) -> None:
    results = load_results(args.out)
    if "calibration" not in results:
        raise SystemExit("run the scores step first")
    scores = stored_scores(results)
    _, evaluation_text = wikitext_split(args.data)
    families = args.families.split(",") if args.families else FAMILIES
    arms = args.arms.split(",")
    for family in families:
        prompts = family_prompts(tokenizer, PromptFamily.parse(family), args.length, DEPTHS, args.keys,
                                 EVAL_SEED + FAMILIES.index(family), evaluation_text)
        if args.first_keys:  # the first keys at each depth of the same prompts (depth-major order)
            prompts = [p for i, p in enumerate(prompts) if i % args.keys < args.first_keys]
        tokens = [len(p.ids) for p in prompts]
        for arm in arms:
            done = load_results(args.out).get("eval", {}).get(str(args.length), {}).get(family, {}).get(arm)
            if done and done["prompts"] == len(prompts):
                continue
            answers = list(done["answers"]) if done and done["keys"] == [p.key for p in prompts][:done["prompts"]] \
                else []  # a cell cut short resumes after its last saved prompt
            policy = arm_policy(arm, model, tokenizer, scores, args.length)
            apply_kv_policy(model, policy)
            start, cpu = time.time(), time.process_time()
            for prompt in prompts[len(answers):]:
                answers += passkey_accuracy(model, tokenizer, [prompt], progress=False,
                                            prefill_chunk=args.prefill_chunk)["answers"]
                ran = prompts[:len(answers)]
                found = [a.strip() == p.key for a, p in zip(answers, ran)]
                row = {"correct": sum(found), "prompts": len(ran), "complete": len(ran) == len(prompts),
                       "by_depth": {str(d): sum(f for f, p in zip(found, ran) if p.depth == d) for d in DEPTHS},
                       "answers": answers, "keys": [p.key for p in ran],
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


def on_keys(row: dict | None, keys: set[str] | None) -> dict | None:
    """``row`` counted on the prompts of ``keys`` only (all of them when ``keys`` is None)."""
    if row is None or keys is None:
        return row
    found = [a.strip() == k for a, k in zip(row["answers"], row["keys"]) if k in keys]
    return {"correct": sum(found), "prompts": len(found)} if found else None


def cell(row: dict | None) -> str:
    if row is None:
        return "—"
    return f"{row['correct']}/{row['prompts']}" + ("" if row.get("complete", True) else " (cut short)")


def table(results: dict) -> str:
    """Markdown: one table per length (family × arm, by depth for the policy), then the budget curve at 2k."""
    lines = []
    for length, by_family in sorted(results.get("eval", {}).items(), key=lambda kv: int(kv[0])):
        main = ["full", "policy@0.5", "streaming@0.5"]
        lines += [f"\n**{int(length):,} tokens** (passkeys found; by depth 0 / .25 / .5 / .75 / 1)\n",
                  "| family | held out | full cache | default policy, half the bytes | StreamingLLM, half the bytes "
                  "| policy − full |", "|---|---|---|---|---|---|"]
        for family in FAMILIES:
            rows = by_family.get(family, {})
            cells = []
            for arm in main:
                r = rows.get(arm)
                cells.append(cell(r) + ("" if r is None else " (" + " / ".join(str(v) for v in r["by_depth"].values())
                                        + ")"))
            policy = rows.get("policy@0.5")
            full = on_keys(rows.get("full"), None if policy is None else set(policy["keys"]))
            gap = ("—" if not (full and policy) else  # on the same prompts (a cell cut short ran fewer)
                   f"{100 * (policy['correct'] - full['correct']) / policy['prompts']:+.0f} pts")
            held = "new keys (calibration family)" if family == CALIBRATION else "new family"
            lines.append(f"| {family} | {held} | " + " | ".join(cells) + f" | {gap} |")
        budgets = sorted({float(arm.split("@")[1]) for rows in by_family.values() for arm in rows
                          if arm.startswith("policy@")})
        if len(budgets) > 1:
            lines += [f"\n**Budget–retrieval curve at {int(length):,} tokens** (the default policy at each budget, "
                      "full heads and window in the header; every cell on the prompts the curve ran, the first key "
                      "at each depth: the full cache and the 0.5 policy re-counted on those)\n"]
            total = sum(results["calibration"][CALIBRATION]["kv_heads"])
            header = [f"{b:g} ({full_heads_for_budget(total, b, int(length), SINK, default_window(b, int(length), SINK))}"
                      f" full, w {default_window(b, int(length), SINK)})" for b in budgets]
            lines += ["| family | full cache | " + " | ".join(header) + " |", "|---|---|" + "---|" * len(budgets)]
            for family in FAMILIES:
                rows = by_family.get(family, {})
                full = rows.get("full")
                keys = None if full is None else set(full["keys"][::max(full["prompts"] // len(DEPTHS), 1)])
                lines.append(f"| {family} | {cell(on_keys(rows.get('full'), keys))} | "
                             + " | ".join(cell(on_keys(rows.get(f"policy@{b:g}"), keys)) for b in budgets) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["scores", "eval", "table"])
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


if __name__ == "__main__":
    sys.exit(main())
