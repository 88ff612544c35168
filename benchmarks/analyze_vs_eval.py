"""`headwise analyze --task lm` against `headwise eval lm` on the same tokens (issue 35: the first analysis of a
language model must take at most 3x its evaluation).

Both run in one process on one loaded model, interleaved (eval, analyze, eval, analyze, ...), exactly as the CLI
runs them: analyze observes the first N texts of the task's calibration part (each cut to --max-length tokens) and
computes the default importance (gradient of the texts' own next-token loss, in the statistics pass: one forward
and one backward per batch of 4 texts); eval scores
perplexity over disjoint windows of --max-length tokens holding as many tokens as analyze observed. A third arm
recomputes the blocks in the backward (``--activations recompute``, bounded memory). Reports the
median seconds of each and their ratios, and writes benchmarks/results/analyze_vs_eval[_quick].json.

Run: ``python benchmarks/analyze_vs_eval.py`` (SmolLM2, 50 texts × 256 tokens, 3 repeats) or ``--quick``
(10 texts × 128 tokens, 1 repeat). Needs shared/data/wikitext-2 (or --data FILE).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from common import machine, median

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--data", default=None, help="text file (default: shared/data/wikitext-2/valid.txt)")
    parser.add_argument("--texts", type=int, default=50)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32, help="as analyze's default")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="10 texts of 128 tokens, 1 repeat")
    args = parser.parse_args()
    if args.quick:
        args.texts, args.max_length, args.repeats = 10, 128, 1

    import headwise
    from headwise.allocator import return_freed_memory
    from headwise.analysis import AnalysisConfig, analyze
    from headwise.tasks import LanguageModeling

    allocator = return_freed_memory()  # as the CLI ($HEADWISE_MMAP_THRESHOLD, default glibc's own)

    task = LanguageModeling(data=args.data, max_length=args.max_length)
    model, tokenizer = headwise.load_model(args.model, task=task)
    texts = [t for t in task.texts("calibration") if t.strip()][: args.texts]
    config = AnalysisConfig(batch_size=min(args.batch_size, task.train_defaults["batch_size"]),  # as the CLI
                            max_length=args.max_length, examples=3, importance=("gradient",))

    def run_analyze(recompute: bool | None = None) -> dict:
        stats = analyze(model, tokenizer, texts, config, loss_fn=task.loss, progress=False, recompute=recompute)
        return {"tokens": stats.to_dict()["tokens"], "seconds": dict(stats.seconds)}

    first = run_analyze()  # also a warm-up; its token count sizes the evaluation
    evaluation = LanguageModeling(data=args.data, max_length=args.max_length, max_tokens=first["tokens"], split="train")
    evaluation.evaluate(model, tokenizer, progress=False)  # warm-up

    times: dict[str, list[float]] = {"eval": [], "analyze": [], "analyze_recomputed": []}
    parts: dict[str, list[dict]] = {"analyze": [], "analyze_recomputed": []}
    for _ in range(args.repeats):
        start = time.perf_counter()
        scored = evaluation.evaluate(model, tokenizer, progress=False)["tokens"]
        times["eval"].append(time.perf_counter() - start)
        for arm, recompute in (("analyze", None), ("analyze_recomputed", True)):
            start = time.perf_counter()
            parts[arm].append(run_analyze(recompute)["seconds"])
            times[arm].append(time.perf_counter() - start)
    result = {
        "model": args.model, "texts": len(texts), "max_length": args.max_length, "tokens_analysed": first["tokens"],
        "tokens_evaluated": scored, "importance": "gradient of the analysed texts' next-token loss (one pass)",
        "repeats": args.repeats, "threads": torch.get_num_threads(), "machine": machine(), "mmap_threshold_set": allocator,
        "eval_seconds": median(times["eval"]), "analyze_seconds": median(times["analyze"]),
        "analyze_parts_seconds": {k: median([p[k] for p in parts["analyze"]]) for k in parts["analyze"][0]},
        "analyze_recomputed_seconds": median(times["analyze_recomputed"]),
        "analyze_recomputed_parts_seconds": {k: median([p[k] for p in parts["analyze_recomputed"]])
                                             for k in parts["analyze_recomputed"][0]},
        "all_seconds": times,
    }
    result["ratio"] = result["analyze_seconds"] / result["eval_seconds"]
    result["ratio_recomputed"] = result["analyze_recomputed_seconds"] / result["eval_seconds"]
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"analyze_vs_eval{'_quick' if args.quick else ''}.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"{args.model}: analyze {result['analyze_seconds']:.1f} s ({result['analyze_parts_seconds']}) vs eval "
          f"{result['eval_seconds']:.1f} s on {result['tokens_analysed']} tokens: ratio {result['ratio']:.2f} "
          f"(≤ 3 wanted); blocks recomputed (--activations recompute): {result['analyze_recomputed_seconds']:.1f} s, "
          f"ratio {result['ratio_recomputed']:.2f}; {out}")


if __name__ == "__main__":
    main()
