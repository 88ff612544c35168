"""Ablation importance on SmolLM2-135M: the layer-by-layer sweep (default) and the mixed batched sweep against
exact one-head-at-a-time ablation (one forward per head): Spearman rank correlation of the [30, 9] tables,
the largest absolute difference, and the time of each (in one process, one after the other: under load only
the ratio means anything). Writes benchmarks/results/ablation_methods.json.

Run: ``python benchmarks/ablation_methods.py [--texts 8] [--max-length 128] [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

import headwise
from headwise.analysis import ablation_importance
from headwise.io import atomic_write_text

DATA = Path("/work/shared/data/wikitext-2/valid.txt")
OUT = Path(__file__).resolve().parent / "results" / "ablation_methods.json"


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = a.argsort().argsort().astype(float), b.argsort().argsort().astype(float)
    return float(np.corrcoef(ra, rb)[0, 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--sweep-batch", type=int, default=256)
    parser.add_argument("--quick", action="store_true", help="4 texts of 32 tokens")
    args = parser.parse_args()
    if args.quick:
        args.texts, args.max_length = 4, 32
    model, tokenizer = headwise.load_model("smollm2-135m", task="lm")
    lines = [line.strip() for line in DATA.read_text().splitlines() if len(line.split()) > 40]
    texts = lines[: args.texts]
    tables, seconds = {}, {}
    for method in ("layers", "batched", "exact"):
        start = time.perf_counter()
        tables[method] = ablation_importance(model, tokenizer, texts, batch_size=args.texts,
                                             sweep_batch=args.sweep_batch, max_length=args.max_length,
                                             progress=False, method=method).numpy()
        seconds[method] = time.perf_counter() - start
        print(method, f"{seconds[method]:.1f}s", flush=True)
    exact = tables["exact"].ravel()
    result = {"model": "smollm2-135m", "texts": len(texts), "max_length": args.max_length,
              "sweep_batch": args.sweep_batch, "threads": torch.get_num_threads(), "seconds": seconds,
              "speedup_vs_exact": {m: seconds["exact"] / seconds[m] for m in ("layers", "batched")},
              "spearman_vs_exact": {m: spearman(tables[m].ravel(), exact) for m in ("layers", "batched")},
              "max_abs_diff_vs_exact": {m: float(np.abs(tables[m] - tables["exact"]).max())
                                        for m in ("layers", "batched")},
              "max_exact": float(exact.max())}
    OUT.parent.mkdir(exist_ok=True)
    atomic_write_text(OUT, json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
