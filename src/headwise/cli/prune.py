"""``headwise prune``: L0, importance or fixed-mask pruning, then physical removal, a saved model and a report (the
run: ``headwise.workflows.prune``)."""

from __future__ import annotations

import argparse
import sys

from ..errors import HeadwiseError
from ..pruning.declaration import STRATEGIES, UNITS
from . import model_args
from .options import add, alias, config_options, output_args, runs_methods
from .recovery_options import recovery_args, recovery_of, refuse_teacher_off
from .task_options import load_task_model, task_args, task_from_args
from .output import print_json


L0_TRAINING = ("lam", "reduction", "lambda_lr", "target_warmup")  # the L0Training fields prune takes (--keep: the target)


def _l0_options(parser: argparse.ArgumentParser) -> None:
    """How the L0 gates train: fields of ``L0Training`` (unset: ``training.recipes.l0_training``)."""
    from ..pruning.config import L0Training

    config_options(parser.add_argument_group("l0 training (L0Training; default: λ from 0 by dual ascent toward "
                                             "--keep over the first half of training)"), L0Training, L0_TRAINING)


# what each page of this verb shows under "examples:" (tests/test_cli_help.py parses every line)
EXAMPLES: dict[str, tuple[str, ...]] = {
    "prune": ("headwise prune --strategy importance --keep 54 --out minilm-prune",
              "headwise prune --task lm --model smollm2-135m --strategy importance --unit kv-group --keep 216 "
              "--out smol-prune"),
}


def register(verbs, parents) -> None:
    p = verbs.add_parser("prune", parents=parents, help="remove attention heads (L0 gates, importance or a mask)")
    p.later(lambda parser: runs_methods(parser, "headwise.pruning"))
    model_args(p)
    p.add_argument("--strategy", choices=STRATEGIES, default=STRATEGIES[0],
                   help=f"how to choose the heads (default: {STRATEGIES[0]})")
    alias(p, "--method", "--strategy", "strategy", choices=STRATEGIES)  # its name before 0.3: a method is registered
    p.add_argument("--keep", type=int, default=None, help="number of query heads to keep (l0, importance)")
    p.add_argument("--unit", choices=UNITS, default="query",
                   help="importance: mask single query heads, or whole key/value groups (kv-group: shrinks a "
                        "grouped-query model's KV cache and keeps heads uniform per layer)")
    p.add_argument("--mask", default=None, help="JSON/YAML file of 0/1 head masks (strategy mask)")
    p.add_argument("--iterative", action="store_true", help="importance: recompute importance after each step")
    p.add_argument("--step", type=int, default=None, help="importance: heads masked per step (default: 10%%)")
    g = p.add_argument_group("training (l0: the gates, jointly with the model, on the task's train split)")
    add(g, "--epochs", default=1.0)
    add(g, "--max-steps", default=-1)
    p.later(_l0_options)
    add(p, "--importance-examples", default=256)
    add(p, "--allow-empty-layers", default=False)
    add(p, "--no-eval")
    p.add_argument("--plain", action="store_true",
                   help="also save DIR/plain, a checkpoint plain transformers loads (removed heads zero-padded where "
                        "the config cannot state other counts)")
    output_args(p, "headwise-pruned", "model/, pruning.json, report.html")
    recovery_args(p)
    task_args(p)
    p.set_defaults(run=run)


def settings_of(args: argparse.Namespace):
    """The ``workflows.prune.PruneSettings`` of the options, checked before the model loads."""
    from ..workflows.prune import PruneSettings

    given = {name: getattr(args, name) for name in L0_TRAINING if hasattr(args, name)}
    return PruneSettings(strategy=args.strategy, keep=args.keep, unit=args.unit,
                         masks=args.mask if args.strategy == "mask" else None,
                         iterative=args.iterative, step=args.step, epochs=args.epochs, max_steps=args.max_steps,
                         importance_examples=args.importance_examples, allow_empty_layers=args.allow_empty_layers,
                         training=given)


def run(args: argparse.Namespace) -> int:
    from ..io import check_writable_dir, plain_problem
    from ..report import Report
    from ..report.pruning import add_pruning_section
    from ..workflows.prune import check_plain, prune
    from .output import save_run

    recovery = recovery_of(args)
    settings = settings_of(args)
    refuse_teacher_off(args)
    check_writable_dir(args.out, args.force)
    settings.load_masks()  # a bad mask file fails before the model loads
    needs_data = settings.strategy != "mask" or recovery.mode != "none" or not args.no_eval
    task = task_from_args(args) if needs_data else None  # bad data fails before the model loads
    model, tokenizer = load_task_model(args, task)  # the head of --task also without evaluation
    if args.plain:
        check_plain(model, settings)  # before any slow work: what the export will need
    found = prune(model, tokenizer, task, settings, recovery, evaluate=not args.no_eval,
                  model_name=args.model or "all-MiniLM-L6-v2")
    result = found.summary
    if result["l0"] and result["l0"]["warning"]:
        print(f"headwise: warning: {result['l0']['warning']}", file=sys.stderr)
    if args.plain:
        problem = ("query-head pruning left key/value groups with only some of their query heads (transformers' "
                   "Llama needs the same number per group); use --unit kv-group") if found.masked_only \
            else plain_problem(model)
        if problem:
            raise HeadwiseError(f"--plain: {problem}; nothing was written")
    report = Report("headwise pruning report", f"{result['model']}: {result['method']} pruning")
    add_pruning_section(report, result)
    save_run(args.out, model, tokenizer, "pruning.json", result, report, overwrite=args.force, plain=args.plain)
    if args.json:
        print_json(result)
    else:
        what = "masked (partial key/value groups stay in the weights)" if found.masked_only else "heads"
        before, edited, recovered = result["metric_before"], result["metric_edited"], result["metric_recovered"]
        print(f"{result['method']}: {result['heads_before']} → {result['heads_after']} {what}, "
              f"{result['costs']['before']['parameters']:,} → {result['costs']['after']['parameters']:,} parameters"
              + ("" if args.no_eval else f", {task.metric} {before} → {edited}"
                 + (f" → {recovered} after {result['recovery']['mode']} recovery" if recovered is not None else "")))
        print(f"saved {args.out}/model (load with headwise.from_pretrained), {args.out}/report.html"
              + (f", {args.out}/plain (plain transformers)" if args.plain else ""))
    return 0
