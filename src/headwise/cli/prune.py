"""``headwise prune``: L0, importance or fixed-mask pruning, then physical removal, a saved model and a report."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from ..errors import HeadwiseError
from . import model_args
from .options import add, config_options, output_args
from .recovery_options import recover_after_edit, recovery_args, recovery_mode, teacher_for
from .task_options import load_task_model, model_costs, run_record, task_args, task_from_args
from .output import print_json

PRUNE_METHODS = ("l0", "importance", "mask")
UNITS = ("query", "kv-group")  # headwise.pruning.schedule.UNITS


L0_TRAINING = ("lam", "reduction", "lambda_lr", "target_warmup")  # the L0Training fields prune takes (--keep: the target)


def _l0_options(parser: argparse.ArgumentParser) -> None:
    """How the L0 gates train: fields of ``L0Training`` (unset: ``tasks.recipes.l0_training``)."""
    from ..pruning.config import L0Training

    config_options(parser.add_argument_group("l0 training (L0Training; default: λ from 0 by dual ascent toward "
                                             "--keep over the first half of training)"), L0Training, L0_TRAINING)


def register(verbs, parents) -> None:
    p = verbs.add_parser("prune", parents=parents, help="remove attention heads (L0 gates, importance or a mask)")
    model_args(p)
    p.add_argument("--method", choices=PRUNE_METHODS, default="l0", help="how to choose the heads (default: l0)")
    p.add_argument("--keep", type=int, default=None, help="number of query heads to keep (l0, importance)")
    p.add_argument("--unit", choices=UNITS, default="query",
                   help="importance: mask single query heads, or whole key/value groups (kv-group: shrinks a "
                        "grouped-query model's KV cache and keeps heads uniform per layer)")
    p.add_argument("--mask", default=None, help="JSON/YAML file of 0/1 head masks (method mask)")
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
                   help="also save DIR/plain, a checkpoint plain transformers loads (Llama family, uniform heads)")
    output_args(p, "headwise-pruned", "model/, pruning.json, report.html")
    recovery_args(p)
    task_args(p)
    p.set_defaults(run=run)


def _check(args: argparse.Namespace) -> None:
    if args.method == "mask":
        if not args.mask:
            raise HeadwiseError("--method mask needs --mask FILE (JSON/YAML: site or kind -> 0/1 per head)")
    elif args.keep is None or args.keep < 1:
        raise HeadwiseError(f"--method {args.method} needs --keep N with N ≥ 1 (the number of heads to keep)")
    if args.epochs <= 0:
        raise HeadwiseError(f"--epochs {args.epochs:g} must be > 0")
    recovery_mode(args)
    if args.unit != "query" and args.method != "importance":
        raise HeadwiseError(f"--unit {args.unit} applies to --method importance; l0 and mask choose query heads")


def _check_plain(args: argparse.Namespace, model) -> None:
    """Refuse ``--plain`` up front when the pruned model cannot be exported: a family without ``head_dim`` in its
    config, query-head pruning of a grouped-query model (partial key/value groups), or a ``--keep`` that cannot
    leave the same whole groups in every layer. (A mask or a ranking can still remove groups unevenly; that is
    known after pruning, which for a mask is quick, and is refused then, before anything is written.)"""
    from ..sites import families_with, family_layout, find_sites

    if not family_layout(model.config.model_type).head_dim_in_config:
        raise HeadwiseError(f"--plain: {model.config.model_type} models cannot be saved in plain transformers format "
                            f"after pruning (only {', '.join(families_with('head_dim_in_config'))} configs carry "
                            "head_dim); drop --plain")
    if args.method == "mask":
        return
    sites = find_sites(model)
    group, total = max(s.group_size for s in sites), sum(s.num_heads for s in sites)
    if group > 1 and (args.method == "l0" or args.unit == "query"):
        raise HeadwiseError(f"--plain: {args.method} pruning of single query heads leaves key/value groups with only "
                            "some of their query heads, which plain transformers cannot hold; use --method importance "
                            "--unit kv-group (nothing was written)")
    per_layer = len(sites) * group  # heads removed in steps of one whole group in every layer
    if args.keep is not None and (total - args.keep) % per_layer:
        fits = sorted({total - per_layer * k for k in range(1, total // per_layer)}, reverse=True)[:3]
        raise HeadwiseError(f"--plain: plain transformers needs the same heads in every layer, so --keep must remove a "
                            f"multiple of {per_layer} of the {total} heads (one group of {group} in each of "
                            f"{len(sites)} layers); e.g. --keep {' or '.join(map(str, fits))} (nothing was written)")


def l0_warning(outcome: dict, args: argparse.Namespace) -> str | None:
    """The line that says L0 training did not reach its target (more gates open than ``--keep``, so the cut to
    ``--keep`` was made by gate ranking), naming the options that would help; None when it did."""
    extra = outcome["open_heads"] - outcome["target_heads"]
    if extra <= 0:
        return None
    trained = f"--max-steps {args.max_steps}" if args.max_steps > 0 else f"--epochs {args.epochs:g}"
    return (f"L0 did not reach its target: {outcome['open_heads']} gates open after {trained} (target --keep "
            f"{outcome['target_heads']}); the other {extra} heads were cut by gate ranking, not by training. Train "
            f"longer (a larger --epochs or --max-steps: the penalty grows with the steps) or use --method importance "
            "(one pass, no training)")


def run(args: argparse.Namespace) -> int:
    from ..io import check_writable_dir
    from ..io import plain_problem
    from ..pruning import apply_masks, load_masks, prune_masked
    from ..report import Report
    from .output import save_run
    from ..report.pruning import add_pruning_section
    from ..sites import find_sites
    from ..tasks.recipes import importance_prune, l0_prune, l0_training, removable

    _check(args)
    check_writable_dir(args.out, args.force)
    spec = load_masks(args.mask) if args.method == "mask" else None
    needs_data = args.method != "mask" or recovery_mode(args) != "none" or not args.no_eval
    task = task_from_args(args) if needs_data else None  # bad data fails before the model loads
    model, tokenizer = load_task_model(args, task)  # the head of --task also without evaluation
    if args.plain:
        _check_plain(args, model)  # before any slow work: what the export will need
    sites = find_sites(model)
    names = [s.name for s in sites]
    before = model_costs(model)
    if args.keep is not None and args.keep > before["heads"]:
        raise HeadwiseError(f"--keep {args.keep} is more than the model's {before['heads']} heads")

    def metric(m) -> float:
        return round(float(task.evaluate(m, tokenizer)[task.metric]), 2)  # progress: a bar, or lines in a log

    metric_before = None if args.no_eval else metric(model)
    teacher = teacher_for(args, model, tokenizer, task)
    curve, masked_only = [], False
    if args.method == "mask":
        apply_masks(model, spec)
        removed = prune_masked(model, args.allow_empty_layers)
    elif args.method == "importance":
        steps = importance_prune(model, tokenizer, args.keep, task, iterative=args.iterative, step=args.step,
                                 examples=args.importance_examples, unit=args.unit,
                                 metric=None if args.no_eval else metric)
        masked_only = not removable(model, steps.steps[-1].masks)
        curve = [[s.kept, s.metric] for s in steps.steps]
        by_path = {s.path: s.name for s in sites}
        removed = {by_path[p]: [h for h, m in enumerate(mask) if not m] for p, mask in steps.steps[-1].masks.items()}
    else:
        l0 = {}
        given = {name: getattr(args, name) for name in L0_TRAINING if hasattr(args, name)}
        training = dataclasses.replace(l0_training(tokenizer, args.keep, task, args.epochs, max_steps=args.max_steps),
                                       **given)
        removed = l0_prune(model, tokenizer, args.keep, task, training=training, epochs=args.epochs,
                           max_steps=args.max_steps, outcome=l0)
        l0["training"] = dataclasses.asdict(training)
        l0["warning"] = l0_warning(l0, args)
        if l0["warning"]:
            print(f"headwise: warning: {l0['warning']}", file=sys.stderr)
        masked_only = sum(s.num_heads for s in find_sites(model)) == before["heads"] and any(removed.values())
    metric_edited = None if args.no_eval else metric(model)
    recovery = recover_after_edit(args, model, tokenizer, task, teacher)
    metric_recovered = None if args.no_eval or recovery["mode"] == "none" else metric(model)
    after_sites = find_sites(model)
    kept = before["heads"] - sum(map(len, removed.values()))
    result = {
        "method": args.method + (" (iterative)" if args.iterative else ""), "model": args.model or "all-MiniLM-L6-v2",
        "task": None if task is None else task.name, "unit": args.unit,
        "heads_before": before["heads"], "heads_after": kept,
        "kv_heads_after": sum(s.num_kv_heads for s in after_sites), "masked_only": masked_only,
        "removed": {n: removed.get(n, []) for n in names},
        "survivors": {s.name: [0 if h in removed.get(s.name, []) else 1 for h in range(s.num_heads)] for s in sites},
        **run_record(task, metric_before, metric_edited, metric_recovered, before, model), "recovery": recovery,
        "curve": curve, "l0": l0 if args.method == "l0" else None,
    }
    if args.plain:
        problem = ("query-head pruning left key/value groups with only some of their query heads (transformers' "
                   "Llama needs the same number per group); use --unit kv-group") if masked_only else plain_problem(model)
        if problem:
            raise HeadwiseError(f"--plain: {problem}; nothing was written")
    report = Report("headwise pruning report", f"{result['model']}: {result['method']} pruning")
    add_pruning_section(report, result)
    save_run(args.out, model, tokenizer, "pruning.json", result, report, overwrite=args.force, plain=args.plain)
    if args.json:
        print_json(result)
    else:
        what = "masked (partial key/value groups stay in the weights)" if masked_only else "heads"
        print(f"{result['method']}: {result['heads_before']} → {result['heads_after']} {what}, "
              f"{before['parameters']:,} → {result['costs']['after']['parameters']:,} parameters"
              + ("" if args.no_eval else f", {task.metric} {metric_before} → {metric_edited}"
                 + (f" → {metric_recovered} after {recovery['mode']} recovery" if metric_recovered is not None
                    else "")))
        print(f"saved {args.out}/model (load with headwise.from_pretrained), {args.out}/report.html"
              + (f", {args.out}/plain (plain transformers)" if args.plain else ""))
    return 0
