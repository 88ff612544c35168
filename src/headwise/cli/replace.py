"""``headwise replace``: run an efficient attention mechanism in place of softmax attention at every (or chosen)
self-attention site; a saved model, replace.json and a report."""

from __future__ import annotations

import argparse
import json

from ..errors import HeadwiseError
from . import model_args
from .options import add, output_args, runs_methods
from .recovery_options import recover_after_edit, recovery_args, recovery_mode, teacher_for
from .task_options import (load_task_model, metric_label, model_costs, run_record, task_args, task_from_args,
                           task_metric)
from .output import print_json


# what each page of this verb shows under "examples:" (tests/test_cli_help.py parses every line)
EXAMPLES: dict[str, tuple[str, ...]] = {
    "replace": ("headwise replace local --arg window=16 --out minilm-replace",),
}


def register(verbs, parents) -> None:
    p = verbs.add_parser("replace", parents=parents,
                         help="replace softmax attention by an efficient mechanism (see `headwise mechanisms list`)")
    p.later(lambda parser: runs_methods(parser, "headwise.mechanisms"))
    model_args(p)
    p.add_argument("mechanism", help="mechanism name, e.g. performer, nystrom, local")
    p.add_argument("--arg", action="append", default=[], metavar="NAME=VALUE",
                   help="a mechanism argument (repeatable), e.g. --arg window=32")
    add(p, "--kinds", default=None)
    add(p, "--no-eval")
    output_args(p, "headwise-replaced", "model/, replace.json, report.html")
    recovery_args(p)
    task_args(p)
    p.set_defaults(run=run)


def parse_mechanism_args(name: str, pairs: list[str]) -> dict:
    """``["window=32", ...]`` → ``{"window": 32}``: each value converted by the type of the mechanism's argument
    (``headwise.flags``: a boolean is true/false, anything else refused)."""
    from ..flags import values_from_pairs
    from ..mechanisms.base import get_mechanism

    try:
        return values_from_pairs(get_mechanism(name).config_class, pairs, f"mechanism {name}")
    except ValueError as err:
        raise HeadwiseError(str(err)) from None


def run(args: argparse.Namespace) -> int:
    from ..io import check_writable_dir
    from ..contract import Selection
    from ..mechanisms import MECHANISMS, use
    from ..report import Report
    from .output import save_run

    if args.mechanism not in MECHANISMS:
        raise HeadwiseError(f"unknown mechanism {args.mechanism!r}; see `headwise mechanisms list`")
    mechanism_args = parse_mechanism_args(args.mechanism, args.arg)
    recovering = recovery_mode(args) != "none"
    check_writable_dir(args.out, args.force)
    evaluate = not args.no_eval
    task = task_from_args(args) if evaluate or recovering else None  # bad data fails before the model loads
    model, tokenizer = load_task_model(args, task)
    teacher = teacher_for(args, model, tokenizer, task, reversible=True)

    def metric() -> float | None:
        return task_metric(task, model, tokenizer) if evaluate else None

    before, costs = metric(), model_costs(model)
    ops = use(model, args.mechanism, selection=Selection(kinds=args.kinds), **mechanism_args)
    edited = metric()
    recovery = recover_after_edit(args, model, tokenizer, task, teacher)
    result = {"model": args.model or "all-MiniLM-L6-v2", "mechanism": args.mechanism, "args": mechanism_args,
              "sites": sorted(ops), **run_record(task, before, edited, metric() if recovering else None, costs, model),
              "recovery": recovery}
    report = Report("headwise attention replacement", f"{result['model']}: {args.mechanism} attention")
    report.add_section("Replacement", f"Softmax attention replaced by {args.mechanism} at {len(ops)} sites.").table(
        [[k, v] for k, v in [("arguments", json.dumps(mechanism_args)), (f"{metric_label(task)} before", before),
                             ("after", result["metric_edited"]),
                             (f"after {result['recovery']['mode']} recovery", result.get("metric_recovered"))]],
        ["", ""])
    save_run(args.out, model, tokenizer, "replace.json", result, report, overwrite=args.force)
    if args.json:
        print_json(result)
    else:
        print(f"{args.mechanism} at {len(ops)} sites" +
              ("" if not evaluate else f", {metric_label(task)} {before} → {edited}"))
        print(f"saved {args.out}/model (load with headwise.from_pretrained), {args.out}/report.html")
    return 0
