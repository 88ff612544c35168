"""Collaborative heads on SmolLM2-135M (rotary, grouped K/V): WikiText-2 perplexity vs the shared width D~k,
weight-space vs data-aware (calibrated) decomposition, one-shot (no re-fine-tuning).

Every one of the 30 layers (9 query / 3 key-value heads of width 64) gets one shared query and one shared key
projection of width D~k (576 = 9 × 64 is exact), made of D~k/2 rotation planes with fixed rotary frequencies and a
complex mixing per head (docs/collaborative.md, "Rotary models"). Evaluation: the first 4,096 tokens of the eval
part of valid.txt (its last 10% of lines) in 1,024-token windows, the convention of experiments/kv_conversion.py.
Calibration (data-aware arms): the first ``--calib-tokens`` tokens of the train part (first 90% of the lines) in
1,024-token windows, input moments computed once and reused by every calibrated arm.

    python experiments/smollm2_collaborative.py [--dks 576,384,256,192] [--objectives weights,scores]
    python experiments/smollm2_collaborative.py --table     # the markdown table of docs/tasks.md
    python experiments/smollm2_collaborative.py --finetune original,scores-192 --finetune-steps 20

``--finetune ARMS`` re-runs those arms (``original`` included, the control: fine-tuning also adapts the instruct
model to WikiText) and then fine-tunes every weight with ``task.finetune`` (next-token loss on the train part,
``--finetune-steps`` steps of one ``--finetune-window``-token window, AdamW ``--finetune-lr``, 10% warm-up);
results under ``ARM+ftSTEPS``.

Results go to ``--out`` after every arm; arms already there are skipped (``--force`` reruns them).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import headwise
from headwise.collaborative import CollaborativeConfig, compress, input_moments
from headwise.io.files import atomic_write_text
from headwise.sites import find_sites
from headwise.training import finetune

WINDOW = 1024
ORIGINAL_KEY_WIDTH = 3 * 64  # key values cached per token and layer by the original (3 KV heads × 64)


def load():
    return headwise.load_model("smollm2-135m", task=headwise.get_task("lm"))


def table(results: dict) -> str:
    """Perplexity per D~k and objective (markdown)."""
    base = results["original"]
    rows = ["| D~k (of 576) | q/k parameters | cached key width | weight-space: perplexity (weight error) "
            "| data-aware: perplexity (score error) |", "|---:|---:|---:|---|---|",
            f"| original | {base['qk_params']:,} | {ORIGINAL_KEY_WIDTH} | {base['perplexity']:.2f} "
            f"| {base['perplexity']:.2f} |"]
    dks = sorted({r["dk"] for n, r in results.items() if n.startswith(("weights", "scores"))}, reverse=True)
    for dk in dks:
        cells = []
        for objective, err in (("weights", "weight_error"), ("scores", "score_error")):
            r = results.get(f"{objective}-{dk}")
            exact = objective == "scores" and dk >= 576
            cell = "—" if r is None else f"{r['perplexity']:,.2f} ({r[err]:.3f})"
            cells.append("(exact: the same)" if exact else cell)
        params = next(r["qk_params"] for n, r in results.items() if n.endswith(f"-{dk}"))
        rows.append(f"| {dk} | {params:,} | {dk} | {cells[0]} | {cells[1]} |")
    tuned = [(n, r) for n, r in results.items() if "+ft" in n]
    if tuned:
        rows += ["", "| arm | one-shot perplexity | after the fine-tune |", "|---|---:|---:|"]
        for name, r in tuned:
            rows.append(f"| {name} | {results[name.split('+')[0]]['perplexity']:,.2f} | {r['perplexity']:,.2f} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dks", default="576,384,256,192")
    parser.add_argument("--objectives", default="weights,scores")
    parser.add_argument("--eval-tokens", type=int, default=4096)
    parser.add_argument("--calib-tokens", type=int, default=16384)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--moments-cache", default="/tmp/headwise-smollm2-collab-moments.pt")
    parser.add_argument("--out", default="experiments/results/smollm2_collaborative.json")
    parser.add_argument("--force", action="store_true", help="rerun arms already in --out")
    parser.add_argument("--finetune", default="", help="comma-separated arms to re-run with a short fine-tune")
    parser.add_argument("--finetune-steps", type=int, default=20)
    parser.add_argument("--finetune-window", type=int, default=256)
    parser.add_argument("--finetune-lr", type=float, default=1e-4)
    parser.add_argument("--table", action="store_true", help="print the results in --out as a markdown table")
    args = parser.parse_args()
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.is_file() else {}
    if args.table:
        print(table(results))
        return
    torch.manual_seed(0)
    task = headwise.get_task("lm", max_length=WINDOW, stride=WINDOW, max_tokens=args.eval_tokens)
    results["setup"] = {"model": "smollm2-135m", "eval": f"first {args.eval_tokens} tokens of the eval part, "
                        f"{WINDOW}-token disjoint windows", "calibration_tokens": args.calib_tokens,
                        "iterations": args.iterations, "torch_threads": torch.get_num_threads()}

    def save() -> None:  # merged with the file: arms can run as separate jobs
        merged = (json.loads(out.read_text()) if out.is_file() else {}) | results
        atomic_write_text(out, json.dumps(merged, indent=1) + "\n")

    def evaluate(model, tokenizer) -> float:
        return float(task.evaluate(model, tokenizer, progress=True)["perplexity"])

    if "original" not in results or args.force:
        model, tokenizer = load()
        start = time.time()
        qk = sum(s.q.weight.numel() + s.k.weight.numel() for s in find_sites(model))
        results["original"] = {"perplexity": evaluate(model, tokenizer), "qk_params": qk,
                               "seconds": round(time.time() - start)}
        print("original", results["original"], flush=True)
        save()
    moments = None

    def compressed(objective: str, dk: int):
        nonlocal moments
        model, tokenizer = load()
        if objective == "scores" and moments is None:
            cache = Path(args.moments_cache)
            if cache.is_file():
                moments = torch.load(cache)
            else:
                calib = headwise.get_task("lm", max_length=WINDOW, max_tokens=args.calib_tokens)
                batches = calib.calibration_inputs(tokenizer, limit=None, batch_size=1)
                moments = input_moments(model, find_sites(model), batches, progress=True)
                torch.save(moments, cache)
        config = CollaborativeConfig(dk=dk, iterations=args.iterations)
        result = compress(model, config=config, moments=moments if objective == "scores" else None, progress=True)
        return model, tokenizer, result

    if args.finetune:
        ft = headwise.get_task("lm", max_length=args.finetune_window)
        for arm in args.finetune.split(","):
            name = f"{arm}+ft{args.finetune_steps}"
            if name in results and not args.force:
                continue
            start = time.time()
            if arm == "original":
                (model, tokenizer), entry = load(), {}
            else:
                objective, dk = arm.rsplit("-", 1)
                model, tokenizer, result = compressed(objective, int(dk))
                entry = {"dk": int(dk), "objective": result.objective, "qk_params": result.params_after}
            finetune(model, tokenizer, ft, max_steps=args.finetune_steps, batch_size=1,
                     learning_rate=args.finetune_lr, logging_steps=10)
            results[name] = entry | {
                "perplexity": evaluate(model, tokenizer), "seconds": round(time.time() - start),
                "finetune": f"task.finetune: {args.finetune_steps} steps x 1 window of {args.finetune_window} "
                            f"tokens (train part), AdamW lr {args.finetune_lr:g}, 10% warm-up"}
            print(name, results[name], flush=True)
            save()
        return
    for objective in args.objectives.split(","):
        for dk in (int(v) for v in args.dks.split(",")):
            name = f"{objective}-{dk}"
            if (name in results and not args.force) or (objective == "scores" and dk >= 576):
                continue  # 576 is exact: the objective does not matter
            start = time.time()
            model, tokenizer, result = compressed(objective, dk)
            decompose_seconds = round(time.time() - start)
            sites = result.sites
            results[name] = {
                "dk": dk, "objective": result.objective, "perplexity": evaluate(model, tokenizer),
                "qk_params": result.params_after,
                "weight_error": sum(s.weight_error for s in sites) / len(sites),
                "score_error": None if sites[0].score_error is None else sum(s.score_error for s in sites) / len(sites),
                "decompose_seconds": decompose_seconds, "seconds": round(time.time() - start),
            }
            print(name, results[name], flush=True)
            save()


if __name__ == "__main__":
    main()
