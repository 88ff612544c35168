"""Michel-style importance pruning of SmolLM2-135M (one-shot): WikiText-2 perplexity vs. query heads kept and vs.
key/value groups kept.

Importance: Michel et al.'s gradient score of the next-token loss, on windows of the train part of
``shared/data/wikitext-2/valid.txt`` (the first 90% of lines); one ranking on the intact model, then the least
important heads are masked down to each count. ``--unit query`` masks single query heads, ``--unit kv-group``
whole key/value groups (3 query heads each), which is what shrinks the KV cache. Perplexity on the eval part (the
last 10% of lines). No recovery fine-tuning here.

    python experiments/smollm2_importance_pruning.py            # writes experiments/results/smollm2_importance_pruning.json

Sizes are reduced for a shared 2-core CPU (see ``--help``): 16 × 256-token windows for importance, the first
4,096 tokens of the eval part in 512-token windows for perplexity.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import headwise
from headwise.io import atomic_write_text
from headwise.pruning import apply_masks, importance_pruning
from headwise.sites import find_sites
from headwise.tasks import LanguageModeling

OUT = Path(__file__).parent / "results" / "smollm2_importance_pruning.json"


def kv_groups_needed(mask: list[float], group: int) -> int:
    """Key/value groups with at least one open query head (the ones the KV cache must keep)."""
    return sum(any(mask[k * group:(k + 1) * group]) for k in range(len(mask) // group))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", default="270,216,162,108", help="query heads kept, comma-separated")
    parser.add_argument("--units", default="query,kv-group")
    parser.add_argument("--importance-windows", type=int, default=16)
    parser.add_argument("--importance-length", type=int, default=256)
    parser.add_argument("--eval-tokens", type=int, default=4096)
    parser.add_argument("--eval-length", type=int, default=512)
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()

    rank_task = LanguageModeling(max_length=args.importance_length)
    eval_task = LanguageModeling(max_length=args.eval_length, max_tokens=args.eval_tokens)
    model, tokenizer = headwise.load_model("smollm2-135m", task=eval_task)
    inputs = rank_task.batches(tokenizer, "train", batch_size=4, limit=args.importance_windows)
    keep = [int(k) for k in args.keep.split(",")]

    def perplexity(m) -> float:
        return round(eval_task.evaluate(m, tokenizer, progress=False)["perplexity"], 3)

    results = {"model": "smollm2-135m (SmolLM2-135M-Instruct, GGUF Q4_1 dequantised)", "heads": 270,
               "kv_groups": 90, "importance": f"gradient of the next-token loss, {args.importance_windows} x "
               f"{args.importance_length}-token windows of the train part (first 90% of lines), one-shot",
               "eval": f"perplexity, first {args.eval_tokens} tokens of the eval part (last 10% of lines), "
               f"{args.eval_length}-token disjoint windows", "curves": {}}
    for unit in args.units.split(","):
        start = time.time()
        curve = importance_pruning(model, tokenizer, inputs=inputs, loss_fn=rank_task.loss, keep=keep, unit=unit,
                                   metric=perplexity)
        sites = find_sites(model)
        results["curves"][unit] = [
            {"query_heads": step.kept, "kv_heads": sum(kv_groups_needed(step.masks[s.path], s.group_size)
                                                       for s in sites), "perplexity": step.metric}
            for step in curve.steps]
        results["curves"][unit + "_seconds"] = round(time.time() - start)
        apply_masks(model, {s.path: [1.0] * s.num_heads for s in sites})  # back to the intact model
        print(unit, json.dumps(results["curves"][unit]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
