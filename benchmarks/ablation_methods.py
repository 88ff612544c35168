"""Ablation importance on SmolLM2-135M: the layer-by-layer sweep (default) and the mixed batched sweep against
exact one-head-at-a-time ablation (one forward per head): Spearman rank correlation of the [30, 9] tables,
the largest absolute difference, and the time of each (in one process, one after the other: under load only
the ratio means anything). Writes benchmarks/results/ablation_methods.json.

``--random``: instead, a random-initialised Llama (12 layers, hidden 256, 8 heads) on 4 texts of ~100 tokens,
the three methods interleaved 3 times in one process (medians), max difference to exact.

Run: ``python benchmarks/ablation_methods.py [--texts 8] [--max-length 128] [--quick] [--random]``.
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


def interleaved_random() -> dict:
    """The three methods on a random-initialised 12-layer Llama, interleaved 3 times (medians)."""
    import statistics
    import sys

    import transformers as tf

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_analysis_support import random_texts, word_tokenizer
    from tiny import VOCAB

    torch.manual_seed(0)
    config = tf.LlamaConfig(hidden_size=256, num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=4,
                            intermediate_size=688, vocab_size=VOCAB, max_position_embeddings=256)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="headwise").eval()
    tokenizer, texts = word_tokenizer("llama"), random_texts(4, seed=1, shortest=100, longest=120)
    times: dict[str, list[float]] = {"layers": [], "batched": [], "exact": []}
    tables = {}
    for _ in range(3):
        for method in times:
            start = time.perf_counter()
            tables[method] = ablation_importance(model.model, tokenizer, texts, batch_size=4, sweep_batch=32,
                                                 progress=False, method=method)
            times[method].append(time.perf_counter() - start)
    med = {m: statistics.median(t) for m, t in times.items()}
    return {"model": "random Llama 12x256, 8 heads", "texts": 4, "threads": torch.get_num_threads(), "seconds": times,
            "median_seconds": med, "speedup_vs_exact": {m: med["exact"] / med[m] for m in ("layers", "batched")},
            "max_abs_diff_vs_exact": {m: float((tables[m] - tables["exact"]).abs().max()) for m in ("layers", "batched")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--sweep-batch", type=int, default=256)
    parser.add_argument("--quick", action="store_true", help="4 texts of 32 tokens")
    parser.add_argument("--random", action="store_true", help="a random 12-layer Llama, methods interleaved")
    args = parser.parse_args()
    if args.random:
        result = interleaved_random()
        OUT.parent.mkdir(exist_ok=True)
        atomic_write_text(OUT.with_name("ablation_methods_random.json"), json.dumps(result, indent=1))
        print(json.dumps(result, indent=1))
        return
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
