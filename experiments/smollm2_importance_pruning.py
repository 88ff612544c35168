"""Michel-style importance pruning of SmolLM2-135M (one-shot and with a short recovery fine-tune): WikiText-2
perplexity vs. query heads kept and vs. key/value groups kept.

Importance: Michel et al.'s gradient score of the next-token loss, on windows of the train part of
``shared/data/wikitext-2/valid.txt`` (the first 90% of lines); one ranking on the intact model, then the least
important heads are masked down to each count. ``--unit query`` masks single query heads, ``--unit kv-group``
whole key/value groups (3 query heads each), which is what shrinks the KV cache. Perplexity on the eval part (the
last 10% of lines).

    python experiments/smollm2_importance_pruning.py            # one-shot curves: experiments/results/smollm2_importance_pruning.json
    python experiments/smollm2_importance_pruning.py --recover --units kv-group --keep 216 --recovery-steps 50

``--recover`` adds points after recovery (``--keep 270``: the control, the unpruned model fine-tuned the same way,
which separates recovery from adapting the instruct model to WikiText): the same one-shot masks, then ``task.finetune`` (next-token loss, AdamW,
10% warm-up) for ``--recovery-steps`` steps of ``--recovery-batch`` windows of ``--importance-length`` tokens from
the train part, masked heads kept masked; the weights are restored before the next point. Points are merged into
the results file (``recovered``), so each can run as a short job.

Sizes are reduced for a shared 2-core CPU (see ``--help``): 16 × 256-token windows for importance, the first
4,096 tokens of the eval part in 512-token windows for perplexity.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

import common
import headwise
from headwise.pruning import apply_masks, importance_pruning
from headwise.sites import find_sites
from headwise.tasks import LanguageModeling
from headwise.training import finetune

OUT = common.RESULTS / "smollm2_importance_pruning.json"
ALL_KEEPS = (216, 162, 108)  # the recovery points share one ranking per unit (cached in the temp folder)


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
    parser.add_argument("--recover", action="store_true", help="recovery fine-tune at each --keep point (< 270)")
    parser.add_argument("--recovery-steps", type=int, default=50)
    parser.add_argument("--recovery-batch", type=int, default=2)
    parser.add_argument("--recovery-lr", type=float, default=5e-5)
    common.add_data(parser, common.WIKITEXT, "the lm task's text file")
    common.add_device(parser)
    args = parser.parse_args()
    if args.recover:
        recover(args)
        return

    rank_task, eval_task = tasks(args)
    model, tokenizer = headwise.load_model("smollm2-135m", task=eval_task, device=args.device)
    inputs = rank_task.batches(tokenizer, "train", batch_size=4, limit=args.importance_windows, device=args.device)
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
    common.save_results(args.out, results)
    print(f"wrote {args.out}")


def tasks(args: argparse.Namespace) -> tuple[LanguageModeling, LanguageModeling]:
    """The ranking task (train windows of ``--importance-length``) and the evaluation task."""
    data = None if args.data is None else str(args.data)
    return (LanguageModeling(data=data, max_length=args.importance_length),
            LanguageModeling(data=data, max_length=args.eval_length, max_tokens=args.eval_tokens))


def recover(args: argparse.Namespace) -> None:
    """Masks of the one-shot ranking at each ``--keep`` count, a short fine-tune, perplexity; merged into ``--out``."""
    rank_task, eval_task = tasks(args)
    model, tokenizer = headwise.load_model("smollm2-135m", task=eval_task, device=args.device)
    inputs = rank_task.batches(tokenizer, "train", batch_size=4, limit=args.importance_windows, device=args.device)
    keep = sorted({int(k) for k in args.keep.split(",")}, reverse=True)  # 270: the control, fine-tuned unpruned
    points = len(keep) * len(args.units.split(","))  # a copy of the weights only when several points share the run
    intact = {name: p.detach().clone() for name, p in model.named_parameters()} if points > 1 else None
    out = Path(args.out)
    recovery = (f"task.finetune: {args.recovery_steps} steps x {args.recovery_batch} windows of "
                           f"{args.importance_length} tokens (train part), AdamW lr {args.recovery_lr:g}, 10% warm-up")
    for unit in args.units.split(","):
        cache = Path(tempfile.gettempdir()) / f"smollm2_importance_masks_{unit}_{args.importance_windows}.json"
        if not cache.is_file():  # the one-shot ranking, computed once per unit
            curve = importance_pruning(model, tokenizer, inputs=inputs, loss_fn=rank_task.loss, keep=ALL_KEEPS,
                                       unit=unit)
            common.save_results(cache, {str(step.kept): step.masks for step in curve.steps})
        masks = common.load_results(cache)
        masks["270"] = {s.path: [1.0] * s.num_heads for s in find_sites(model)}
        for kept in keep:
            start = time.time()
            apply_masks(model, masks[str(kept)])
            finetune(model, tokenizer, rank_task, max_steps=args.recovery_steps, batch_size=args.recovery_batch,
                     learning_rate=args.recovery_lr, logging_steps=10)
            point = {"query_heads": kept, "kv_heads": sum(kv_groups_needed(masks[str(kept)][s.path], s.group_size)
                                                          for s in find_sites(model)),
                     "perplexity": round(eval_task.evaluate(model, tokenizer, progress=False)["perplexity"], 3),
                     "steps": args.recovery_steps, "seconds": round(time.time() - start)}
            if intact is not None:
                with torch.no_grad():
                    for name, p in model.named_parameters():
                        p.copy_(intact[name])
            def update(results: dict, unit: str = unit, kept: int = kept, point: dict = point) -> None:
                results["recovery"] = recovery
                points = [p for p in results.setdefault("recovered", {}).get(unit, []) if p["query_heads"] != kept]
                results["recovered"][unit] = sorted(points + [point], key=lambda p: -p["query_heads"])

            common.merge_results(out, update)  # re-read: points merge across jobs
            print(unit, json.dumps(point), flush=True)
        apply_masks(model, {s.path: [1.0] * s.num_heads for s in find_sites(model)})


if __name__ == "__main__":
    main()
