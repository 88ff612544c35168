"""spiqa on SmolLM2-135M: WikiText-2 perplexity vs. bits for every attention-probability quantizer, and vs.
sparsity for threshold pruning (the sweep ``headwise quantize --task lm`` runs).

Each call sweeps a part of the grid (``--methods``, ``--thresholds``) and merges its rows into the results file,
keyed by setting label (a re-run replaces its rows), so the grid can be run in short jobs on a shared CPU; a
part whose settings are all in the file is skipped. ``--table`` prints the docs tables from the file.

    python experiments/smollm2_spiqa.py --methods none --thresholds 1e-4,1e-3,3e-3,0.01,0.02,0.03,0.05,0.1,0.2
    python experiments/smollm2_spiqa.py --methods linear_slinear,linear_slinear_midval --thresholds none
    python experiments/smollm2_spiqa.py --table

The same sweep from the CLI (one job, all settings):

    headwise quantize --task lm --model smollm2-135m --max-length 512 --max-tokens 4096 --bits 2..4

Sizes are reduced for a shared 2-core CPU (see ``--help``): the first 1,024 tokens of the eval part (last 10% of
lines of ``shared/data/wikitext-2/valid.txt``) in 512-token disjoint windows, and no distinct-value counts.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import common
import headwise
from headwise.quantization.functional import QUANTIZERS
from headwise.quantization.sweep import SweepConfig, sweep
from headwise.tasks import LanguageModeling

OUT = common.RESULTS / "smollm2_spiqa.json"


def parse_list(text: str, kind: type) -> tuple:
    return () if text.strip() == "none" else tuple(kind(p) for p in text.split(",") if p.strip())


def cell(row: dict) -> str:
    return f"{row['perplexity']:.2f} ({100 * row['sparsity']:.0f}%)"


def table(results: dict) -> str:
    """Markdown: perplexity (measured sparsity) per quantizer × bits, then threshold pruning."""
    rows = results["rows"]
    bits = sorted({r["bits"] for r in rows if r["bits"] is not None})
    lines = [f"baseline perplexity {results['baseline']:.2f}", "",
             "| quantizer | " + " | ".join(f"{b} bits" for b in bits) + " |",
             "|---|" + "---|" * len(bits)]
    for method in dict.fromkeys(r["method"] for r in rows if r["method"] != "none"):
        by_bits = {r["bits"]: r for r in rows if r["method"] == method}
        if None in by_bits:  # binarization: one setting
            lines.append(f"| {method} (1 bit) | " + " | ".join([cell(by_bits[None])] + ["—"] * (len(bits) - 1)) + " |")
            continue
        lines.append(f"| {method} | " + " | ".join(cell(by_bits[b]) if b in by_bits else "—" for b in bits) + " |")
    lines += ["", "| threshold | sparsity | perplexity |", "|---|---|---|"]
    for r in sorted((r for r in rows if r["method"] == "none"), key=lambda r: r["threshold"]):
        lines.append(f"| {r['threshold']:g} | {100 * r['sparsity']:.1f}% | {r['perplexity']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="all", help="comma-separated quantizers, all, or none")
    parser.add_argument("--bits", default="2,3,4")
    parser.add_argument("--thresholds", default="none", help="pruning-only thresholds, comma-separated, or none")
    parser.add_argument("--eval-tokens", type=int, default=1024)
    parser.add_argument("--eval-length", type=int, default=512)
    parser.add_argument("--distinct-calls", type=int, default=0,
                        help="calls per site whose distinct values are counted (torch.unique; slow on a CPU)")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--table", action="store_true", help="print the markdown tables of --out and stop")
    common.add_data(parser, common.WIKITEXT, "the lm task's text file")
    common.add_device(parser)
    args = parser.parse_args()
    out = Path(args.out)
    results = common.load_results(out) or None
    if args.table:
        print(table(results))
        return

    methods = tuple(QUANTIZERS) if args.methods == "all" else parse_list(args.methods, str)
    config = SweepConfig(methods=methods, bits=parse_list(args.bits, int),
                         thresholds=parse_list(args.thresholds, float), distinct_calls=args.distinct_calls)
    done = {r["label"] for r in results["rows"]} if results else set()
    if all(s.label in done for s in config.settings()):
        print("every setting is already in", out)
        return
    task = LanguageModeling(data=None if args.data is None else str(args.data), max_length=args.eval_length,
                            max_tokens=args.eval_tokens)
    model, tokenizer = headwise.load_model("smollm2-135m", task=task, device=args.device)
    start = time.time()
    result = sweep(model, config, metric=task.metric_fn(tokenizer), progress=True)
    fresh = [{k: v for k, v in r.items() if k != "per_head"} | {"perplexity": -r["metric"]} for r in result.rows]
    results = results or {
        "model": "smollm2-135m (SmolLM2-135M-Instruct, GGUF Q4_1 dequantised)",
        "eval": f"perplexity, first {args.eval_tokens} tokens of the eval part (last 10% of lines of "
                f"wikitext-2/valid.txt), {args.eval_length}-token disjoint windows",
        "baseline": -result.baseline, "tolerance": result.tolerance, "rows": [], "seconds": 0}
    results["rows"] = [r for r in results["rows"] if r["label"] not in {f["label"] for f in fresh}] + fresh
    results["seconds"] += round(time.time() - start)
    common.save_results(out, results)
    for r in fresh:
        print(f"{r['label']:40} perplexity {r['perplexity']:9.3f} sparsity {r['sparsity']:.3f}", flush=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
