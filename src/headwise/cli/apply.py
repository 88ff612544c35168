"""``headwise apply plan.json``: perform a planned edit, recover, evaluate (``headwise.workflows.apply_plan``), save
the model and a report."""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import HeadwiseError
from . import model_args
from .options import add, alias, output_args
from .recovery_options import train_memory_arg
from .output import print_json

PACKAGED = "all-MiniLM-L6-v2"  # how plans name the packaged default model (load_model(None))


# what each page of this verb shows under "examples:" (tests/test_cli_help.py parses every line)
EXAMPLES: dict[str, tuple[str, ...]] = {
    "apply": ("headwise apply minilm-plan/plan.json --out minilm-applied",),
}


def register(verbs, parents) -> None:
    p = verbs.add_parser("apply", parents=parents, help="perform the edit of a plan.json (headwise plan)")
    p.add_argument("plan", help="the plan.json written by headwise plan")
    model_args(p)
    p.add_argument("--point", default=None, help="apply this point of the plan (default: the recommended one)")
    g = p.add_argument_group("recovery after the edit")
    add(g, "--recover", default=None, shown="what the plan used, else none")
    add(g, "--recover-epochs", default=1.0)
    add(g, "--recover-steps", default=-1)
    alias(g, "--recover-max-steps", "--recover-steps", "recover_steps", type=int)
    train_memory_arg(g)
    add(p, "--no-eval")
    output_args(p, "headwise-applied", "model/, apply.json, report.html")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..io import check_writable_dir, plain_problem
    from ..planning import Plan
    from ..report import Report
    from ..workflows.apply_plan import apply_plan
    from ..training.recovery import Recovery
    from .output import save_run
    from .task_options import load_task_model

    plan = Plan.load(args.plan)
    point = plan.point(args.point)
    mode = args.recover or plan.settings.get("recover", "none")
    if args.recover_epochs <= 0 and mode != "none":
        raise HeadwiseError("--recover-epochs must be > 0 with --recover distill|finetune")
    recovery = Recovery(mode=mode, epochs=args.recover_epochs, steps=args.recover_steps, memory=args.train_memory)
    check_writable_dir(args.out, args.force)
    task = plan.make_task()
    task.check()
    args.model = args.model or (None if plan.model.startswith(PACKAGED) else plan.model)
    model, tokenizer = load_task_model(args, task)
    note = plan.check_model(model)  # another model (e.g. its heads already pruned) is refused here
    if note:
        print(f"headwise: note: {note}", file=sys.stderr)
    summary = apply_plan(model, tokenizer, plan, point.name, recovery=recovery, task=task, evaluate=not args.no_eval,
                         plan_path=str(args.plan))
    no_plain = plain_problem(model)  # why there is no plain/ (said below, kept in apply.json), or None
    native = no_plain is None
    summary["plain"] = "plain/ loads in plain transformers" if native else f"no plain/: {no_plain}"
    report = Report("headwise apply", f"{plan.model}: {point.edit.describe()}")
    before = summary["metric_before"]
    after = summary["metric_edited"] if mode == "none" else summary["metric_recovered"]
    shown = {k: "—" if v is None else f"{v:.2f}" for k, v in (("before", before), ("after", after))}
    section = report.add_section(
        "Verdict", f"**Applied {point.edit.describe()}** (`{point.name}`): {task.metric} {shown['after']} "
                   f"(before {shown['before']}; the plan measured {point.measured['score']:.2f} with recovery "
                   f"{plan.settings.get('recover', 'none')}, this run recovered with {mode}); {summary['saves']}. "
                   f"Reload with `headwise.from_pretrained('{args.out}/model')`"
                   + (f"; `{args.out}/plain` loads in plain transformers." if native else "."))
    section.table([[k, json.dumps(v) if isinstance(v, (dict, list)) else v] for k, v in summary.items()],
                  ["", "value"])
    save_run(args.out, model, tokenizer, "apply.json", summary, report, overwrite=args.force, plain=native)
    if not native:
        print(f"headwise: note: no {args.out}/plain: {no_plain}", file=sys.stderr)
    if args.json:
        print_json(summary)
    else:
        print(f"applied {point.name}: {point.edit.describe()}"
              + ("" if after is None else f", {task.metric} {before:.2f} → {after:.2f}"))
        print(f"saved {args.out}/model (load with headwise.from_pretrained), {args.out}/report.html"
              + (f", {args.out}/plain (plain transformers)" if native else ""))
    return 0
