"""Per-head KV cache on SmolLM2-135M: passkey retrieval and WikiText-2 perplexity through the compressed cache.

Arms at the same KV bytes (``--budget`` of the full cache at ``--length`` tokens):
  full       every head keeps every token;
  policy     the heads ``headwise.kv_policy`` ranks first (combined score) stay full, the others keep sink + window
             (policy-retrieval, policy-outside: ranked by one score only);
  random     as many full heads, chosen at random;
  streaming  every head keeps sink + a longer window (StreamingLLM), as many bytes.

Run one step at a time (each a few CPU-minutes with 2 threads); results accumulate in ``--out`` (default
experiments/results/kv_policy.json; experiments/kv_policy_results.json holds the earlier run with raw-text prompts):
  python experiments/kv_policy.py scores               # head scores for 3 calibration seeds, the chosen policies
  python experiments/kv_policy.py arm full --length 2048 --keys 10 --chunks 2     # stored as "full@2048"
  # half the KV bytes at 2k, 18 retrieval heads full + window 764 on the rest (kv_policy's defaults at 0.5 x 2048;
  # --window 508 / 828 / 892 / 956: 30 / 14 / 10 / 5 full heads):
  python experiments/kv_policy.py arm policy-retrieval --length 2048 --size-at 2048 --window 764 --keys 10 --chunks 2
  python experiments/kv_policy.py arm streaming --length 2048 --size-at 2048 --window 508 --keys 10 --chunks 2
  python experiments/kv_policy.py arm random --length 2048 --size-at 2048 --window 508 --keys 10 --chunks 2
  # the same arms on new keys (seed 2000) and the next --chunks chunks, stored as "...@heldout":
  python experiments/kv_policy.py arm policy-retrieval --length 2048 --size-at 2048 --window 764 --keys 10 \
      --chunks 2 --heldout
  python experiments/kv_policy.py arm policy         # combined ranking, sized at 1024 with the calibration's window
  python experiments/kv_policy.py learn --device cuda --steps 1000 --gate-length 2048   # DuoAttention-style gates
  python experiments/kv_policy.py arm policy-learned --device cuda     # the heads the gates keep full
  python experiments/kv_policy.py learn --quick        # smoke run on CPU: 4 steps at 512 tokens ("learned-quick")
  python experiments/kv_policy.py plot                 # docs/kv-policy-{perplexity,passkey}.svg from the JSON
``--window`` other than the calibration's ranks by retrieval, copy or induction only (``outside`` was measured for
the calibration's window). Perplexity runs through ``headwise.kvcache.policy_forward``: one prefill per chunk
through a PolicyCache, which applies each head's rule to every query exactly as decoding does.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from headwise.compat import CACHE
from headwise.io import atomic_write_text
from headwise.training import train_kv_gates
from headwise.kvcache import (KVGateConfig, KVPolicy, ScoreConfig, apply_kv_policy, full_heads_for_budget,
                              head_scores, passkey_prompts, policy_forward, rank_kv_heads, streaming)
from headwise.kvcache.scores import HeadScores
from headwise.models import resolve_model
from headwise.tasks.paths import shared_data

RESULTS = Path(__file__).parent / "results" / "kv_policy.json"


def load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def save(path: Path, results: dict) -> None:
    atomic_write_text(path, json.dumps(results, indent=1))


def wikitext_lines(data: Path) -> tuple[list[str], list[str]]:
    """First 90% of lines: calibration; last 10%: evaluation (fixed split, as the data README asks)."""
    lines = [line for line in data.read_text(encoding="utf-8").splitlines() if line.strip()]
    cut = int(len(lines) * 0.9)
    return lines[:cut], lines[cut:]


def jaccard(a: set, b: set) -> float:
    return len(a & b) / max(len(a | b), 1)


def run_scores(args, model, tokenizer, results: dict) -> None:
    calib, _ = wikitext_lines(args.data)
    joined = " ".join(calib)
    pieces = [joined[i: i + 3000] for i in range(0, len(joined) - 3000, 3000)]  # ~650 tokens each
    n_full = full_heads_for_budget(90, args.budget, args.length, args.sink, args.window)
    seeds = {}
    for seed in (0, 1, 2):
        start, cpu = time.time(), time.process_time()
        texts = random.Random(seed).sample(pieces, 2)
        config = ScoreConfig(length=512, keys=1, sink=args.sink, window=args.window, seed=seed)
        scores = head_scores(model, tokenizer, config, texts=texts)
        chosen = {by: sorted(rank_kv_heads(scores, by)[:n_full]) for by in ("combined", "retrieval", "outside")}
        seeds[str(seed)] = {"seconds": round(time.time() - start, 1),
                            "cpu_seconds": round(time.process_time() - cpu, 1), "scores": scores.to_dict(),
                            "full_heads": {k: [list(p) for p in v] for k, v in chosen.items()}}
    stability = {}
    for by in ("combined", "retrieval", "outside"):
        sets = [set(map(tuple, seeds[s]["full_heads"][by])) for s in seeds]
        stability[by] = [round(jaccard(sets[i], sets[j]), 3) for i, j in ((0, 1), (0, 2), (1, 2))]
    results["scores"] = {"budget": args.budget, "length": args.length, "sink": args.sink, "window": args.window,
                         "full_heads": n_full, "seeds": seeds, "jaccard_pairs": stability}


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Rank correlation of two score tables (ties broken by position)."""
    ra, rb = (torch.argsort(torch.argsort(x.flatten(), stable=True)).double() for x in (a, b))
    return float(torch.corrcoef(torch.stack([ra, rb]))[0, 1])


def run_learn(args, model, tokenizer, results: dict) -> None:
    """Train one gate per KV head (model frozen), keep the top ``full_heads`` by α; compare with the training-free
    rankings of calibration seed 0 (Jaccard of the kept heads, Spearman over all 90 KV heads)."""
    config = KVGateConfig(steps=args.steps, lr=args.gate_lr, l1=args.gate_l1, length=args.gate_length,
                          sink=args.sink, window=args.window, region=args.gate_region, haystack=args.gate_haystack,
                          seed=args.seed)
    texts = wikitext_lines(args.data)[0] if args.gate_haystack == "text" else None
    start = time.time()
    learned = train_kv_gates(model, tokenizer, config, texts=texts)
    seconds = time.time() - start
    scores = learned.scores(model.config.num_attention_heads)
    n_full = (results["scores"]["full_heads"] if "scores" in results
              else full_heads_for_budget(90, args.budget, args.length, args.sink, args.window))
    kept = sorted(rank_kv_heads(scores, "learned")[:n_full])
    row = {"config": learned.to_dict()["config"], "device": str(model.device), "seconds": round(seconds, 1),
           "alpha": learned.alpha.tolist(), "open_gates": int((learned.alpha > 0).sum()),
           "full_heads": [list(p) for p in kept],
           "history": [h for h in learned.history if h["step"] % 10 == 0 or h["step"] == config.steps - 1]}
    if "scores" in results:
        seed0 = results["scores"]["seeds"]["0"]
        stored = HeadScores({k: torch.tensor(v) for k, v in seed0["scores"]["per_query_head"].items()}, [3] * 30)
        row["jaccard"] = {by: round(jaccard(set(kept), set(map(tuple, seed0["full_heads"][by]))), 3)
                          for by in ("combined", "retrieval")}
        combined = torch.zeros(30 * 3)
        for rank, (layer, head) in enumerate(rank_kv_heads(stored, "combined")):
            combined[layer * 3 + head] = -rank
        row["spearman"] = {"combined": round(spearman(learned.alpha, combined), 3),
                           "retrieval": round(spearman(learned.alpha, stored.kv("retrieval")), 3)}
    if args.quick:
        row["note"] = "smoke run (--quick): a handful of steps to prove the pipeline, not a result"
    results["learned-quick" if args.quick else "learned"] = row
    print({k: row[k] for k in ("seconds", "device", "open_gates", "jaccard", "spearman") if k in row},
          "mean alpha", round(learned.alpha.mean().item(), 3))


def policies(args, model, results: dict) -> dict[str, KVPolicy]:
    """The arms, sized to ``--budget`` of the full cache at ``--size-at`` tokens (default: the scored policies at
    the calibration's length, 1024; StreamingLLM at ``--length``): as many full heads as fit next to
    ``sink + window`` on the others."""
    calibrated = results["scores"]["length"]
    size_at = args.size_at or calibrated
    n_full = results["scores"]["full_heads"]
    chosen = {by: set(map(tuple, heads)) for by, heads in results["scores"]["seeds"]["0"]["full_heads"].items()}
    stored = results["scores"]["seeds"]["0"]["scores"]["per_query_head"]
    if args.window != results["scores"]["window"]:  # re-size for this window; `outside` was measured for another
        n_full = full_heads_for_budget(90, args.budget, size_at, args.sink, args.window)
        scores = HeadScores({k: torch.tensor(v) for k, v in stored.items() if k != "outside"}, [3] * 30)
        chosen = {by: set(rank_kv_heads(scores, by)[:n_full]) for by in ("retrieval", "copy", "induction")}
    elif size_at != calibrated:  # same scores, more full heads at a longer context
        n_full = full_heads_for_budget(90, args.budget, size_at, args.sink, args.window)
        scores = HeadScores({k: torch.tensor(v) for k, v in stored.items()}, [3] * 30)
        chosen = {by: set(rank_kv_heads(scores, by)[:n_full]) for by in ("combined", "retrieval")}
    random_heads = set(rank_kv_heads(HeadScores({}, [3] * 30), "random", seed=0)[:n_full])
    if "learned" in results and results["learned"]["config"]["window"] == args.window:  # the gates' top heads
        alpha = torch.tensor(results["learned"]["alpha"])
        order = sorted(range(90), key=lambda i: (-float(alpha.flatten()[i]), i))
        chosen["learned"] = {(i // 3, i % 3) for i in order[:n_full]}
    # StreamingLLM: every head keeps budget·tokens (at --size-at, else at --length: half the bytes at that length)
    stream_window = int(args.budget * (args.size_at or args.length)) - args.sink
    return {"full": KVPolicy.uniform(model),
            **{f"policy-{by}" if by != "combined" else "policy": KVPolicy.keep_full(model, heads, args.sink,
                                                                                   args.window)
               for by, heads in chosen.items()},
            "random": KVPolicy.keep_full(model, random_heads, args.sink, args.window),
            "streaming": KVPolicy.uniform(model, streaming(args.sink, stream_window))}


def passkey(model, tokenizer, args) -> dict:
    prompts = passkey_prompts(tokenizer, args.length, [0.0, 0.25, 0.5, 0.75, 1.0], args.keys,
                              seed=2000 if getattr(args, "heldout", False) else 1000)
    rows, stored = [], []
    for p in prompts:
        ids = p.ids[None].to(model.device)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=len(p.answer_ids),
                             do_sample=False, return_dict_in_generate=True, pad_token_id=tokenizer.eos_token_id)
        text = tokenizer.decode(out.sequences[0, ids.shape[1]:])
        cache = out[CACHE]
        stored.append(cache.stored_bytes() / cache.get_seq_length())
        rows.append({"depth": p.depth, "key": p.key, "answer": text, "correct": text.strip() == p.key})
    by_depth = {}
    for r in rows:
        by_depth.setdefault(str(r["depth"]), []).append(r["correct"])
    return {"tokens": int(len(prompts[0].ids)), "accuracy": sum(r["correct"] for r in rows) / len(rows),
            "by_depth": {d: sum(v) / len(v) for d, v in by_depth.items()}, "prompts": rows,
            "kv_bytes_per_token": sum(stored) / len(stored)}


def perplexity(model, tokenizer, args) -> dict:
    _, evaluation = wikitext_lines(args.data)
    ids = tokenizer("\n".join(evaluation), add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    nll, count = 0.0, 0
    # held out: the chunks after those the arms were compared on (callers' namespaces may lack the flag)
    first = args.chunks if getattr(args, "heldout", False) else 0
    for c in range(first, first + args.chunks):
        chunk = ids[c * args.length: (c + 1) * args.length][None].to(model.device)
        with torch.no_grad(), policy_forward(model):
            logits = model(chunk).logits
        nll += torch.nn.functional.cross_entropy(logits[0, :-1].float(), chunk[0, 1:],
                                                 reduction="sum").item()
        count += chunk.shape[1] - 1
    return {"chunks": args.chunks, "first_chunk": first, "tokens_per_chunk": args.length, "ppl": math.exp(nll / count)}


def run_arm(args, model, tokenizer, results: dict) -> None:
    policy = policies(args, model, results)[args.arm]
    apply_kv_policy(model, policy)
    start = time.time()
    row = {"policy": policy.describe(), "kv_fraction": {str(t): round(policy.kv_fraction(t), 4)
                                                        for t in (args.length, 2048)},
           "kv_bytes_per_token_formula": {str(t): policy.kv_bytes(t, 64, 4) / t for t in (args.length, 2048)}}
    row["passkey"] = passkey(model, tokenizer, args)
    row["wikitext2"] = perplexity(model, tokenizer, args)
    row["seconds"] = round(time.time() - start, 1)
    row["device"] = str(model.device)
    row["threads"] = torch.get_num_threads()
    name = args.arm if args.length == results["scores"]["length"] else f"{args.arm}@{args.length}"
    name += "" if args.window == results["scores"]["window"] else f"@w{args.window}"
    name += f"@size{args.size_at}" if args.size_at else ""
    name += "@heldout" if args.heldout else ""
    results.setdefault("arms", {})[name] = row
    print(args.arm, row["passkey"]["accuracy"], row["wikitext2"]["ppl"], row["kv_fraction"])


ARM_LABELS = {  # the arms plotted: half the KV bytes at 2048 tokens, 50 passkey prompts each
    "full@2048": "full cache", "policy-retrieval@2048@w508@size2048": "headwise: 30 retrieval heads full, window 508",
    "policy-retrieval@2048@w764@size2048": "headwise: 18 retrieval heads full, window 764",
    "policy-retrieval@2048@w828@size2048": "headwise: 14 retrieval heads full, window 828",
    "policy-retrieval@2048@w892@size2048": "headwise: 10 retrieval heads full, window 892",
    "policy-retrieval@2048@w956@size2048": "headwise: 5 retrieval heads full, window 956",
    "streaming@2048@w508@size2048": "StreamingLLM: window 1020 on every head",
    "random@2048@w508@size2048": "30 random heads full, window 508"}


def plot(results: dict) -> tuple[str, str]:
    """Perplexity and passkey retrieval vs the KV bytes each arm held at ~2k tokens: two panels, one marker per arm."""
    from headwise.report import svg

    arms = {label: results["arms"][name] for name, label in ARM_LABELS.items() if name in results.get("arms", {})}
    x = lambda r: [r["passkey"]["kv_bytes_per_token"] / 1024]  # noqa: E731
    ppl = svg.lines({k: (x(r), [r["wikitext2"]["ppl"]]) for k, r in arms.items()},
                    "KV KiB per token held (fp32, ~2k tokens)", "WikiText-2 perplexity",
                    "SmolLM2-135M: perplexity vs KV cache", width=640)
    keys = svg.lines({k: (x(r), [100 * r["passkey"]["accuracy"]]) for k, r in arms.items()},
                     "KV KiB per token held (fp32, ~2k tokens)", "passkey exact match %",
                     "SmolLM2-135M: passkey retrieval vs KV cache", width=640, ylim=(0, 100))
    return ppl, keys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["scores", "learn", "arm", "plot"])
    parser.add_argument("arm", nargs="?",
                        choices=["full", "policy", "policy-retrieval", "policy-outside", "policy-copy",
                                 "policy-induction", "policy-learned", "random", "streaming"])
    parser.add_argument("--budget", type=float, default=0.5)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--sink", type=int, default=4)
    parser.add_argument("--window", type=int, default=124)
    parser.add_argument("--size-at", type=int, default=None,
                        help="arm: size the policies to --budget at this many tokens (default: the calibration's)")
    parser.add_argument("--keys", type=int, default=3, help="passkeys per depth (5 depths)")
    parser.add_argument("--chunks", type=int, default=3, help="WikiText-2 chunks of --length tokens")
    parser.add_argument("--data", type=Path, default=None, help="default: shared/data/wikitext-2/valid.txt")
    parser.add_argument("--heldout", action="store_true",
                        help="arm: passkey seed 2000 instead of 1000 and the next --chunks WikiText-2 chunks (a check "
                             "of settings chosen on the default prompts); stored with the suffix @heldout")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cuda")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--steps", type=int, default=1000, help="learn: gate training steps, one prompt each")
    parser.add_argument("--gate-length", type=int, default=2048, help="learn: tokens per training prompt")
    parser.add_argument("--gate-lr", type=float, default=0.02)
    parser.add_argument("--gate-l1", type=float, default=0.05, help="learn: weight of mean(alpha)")
    parser.add_argument("--gate-region", default="answer", choices=["answer", "all"])
    parser.add_argument("--gate-haystack", default="filler", choices=["filler", "text"])
    parser.add_argument("--seed", type=int, default=0, help="learn: seed of the training prompts")
    parser.add_argument("--quick", action="store_true",
                        help="learn: 4 steps at 512 tokens (CPU smoke run), stored as 'learned-quick'")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.gate_length = min(args.steps, 4), 512
    args.data = args.data or shared_data("wikitext-2/valid.txt", "--data")
    if args.step == "plot":
        docs = Path(__file__).resolve().parents[1] / "docs"
        for name, figure in zip(("kv-policy-perplexity.svg", "kv-policy-passkey.svg"), plot(load(args.out))):
            atomic_write_text(docs / name, figure)
        return
    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    path = resolve_model("smollm2-135m")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="headwise", dtype=torch.float32).eval()
    model.to(args.device)
    results = load(args.out)
    results["model"] = ("smollm2-135m (SmolLM2-135M-Instruct, 30 layers x 3 KV heads, float32; CPU, 1 thread unless "
                        "a row names another device)")
    if args.step == "scores":
        run_scores(args, model, tokenizer, results)
    elif args.step == "learn":
        run_learn(args, model, tokenizer, results)
    else:
        if "scores" not in results:
            parser.error("run the scores step first")
        run_arm(args, model, tokenizer, results)
    save(args.out, results)


if __name__ == "__main__":
    main()
