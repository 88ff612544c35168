"""``headwise plan``: a budget in; a measured Pareto front, a recommended edit, plan.json and a report out."""

from __future__ import annotations

import argparse
import shlex

from ..errors import HeadwiseError
from . import model_args
from .options import add, output_args
from .suggest import LOADING, suggest
from .task_options import load_task_model, task_args, task_from_args
from .output import print_json, write_json


# what each page of this verb shows under "examples:" (tests/test_cli_help.py parses every line)
EXAMPLES: dict[str, tuple[str, ...]] = {
    "plan": ("headwise plan --budget heads=0.75 --out minilm-plan",
             "headwise plan --task lm --model smollm2-135m --budget kv-cache=-20% --out smol-plan"),
}


def register(verbs, parents) -> None:
    from ..contract import declarations

    planned = sorted((d for d in declarations().values() if d.planned), key=lambda d: d.planned.order)
    rankings = tuple(dict.fromkeys(r for d in planned for r in d.planned.rankings))  # of the head-removal methods
    p = verbs.add_parser("plan", parents=parents, help="search edits under a budget; measure them; recommend one")
    model_args(p)
    p.add_argument("--budget", required=True,
                   help="limits, comma-separated: heads=N|fraction, latency=0.75x, params=-20%% (attention "
                        "parameters), kv-cache=-50%% (decoders), flops=-30%%")
    p.add_argument("--methods", default=None,
                   help=f"registered methods to try and combine, comma-separated (default: every planned method: "
                        f"{','.join(d.name for d in planned)}, and any a plugin registers)")
    p.add_argument("--ranking", choices=rankings, default=rankings[0],
                   help=f"how heads are ranked for removal, by the head-removal method (docs/plan.md; default: "
                        f"{rankings[0]})")
    add(p, "--importance-examples", default=256)
    p.add_argument("--importance-batch", type=int, default=8,
                   help="examples per backward of the gradient ranking (default: 8; lower it to lower peak memory)")
    add(p, "--calibration-limit", default=64)  # collaborative and KV fits, output-error proxies
    p.add_argument("--top-k", type=int, default=3,
                   help="combined plans measured: the K best predicted, plus the best and the cheapest pair of each "
                        "level of heads removed (default: 3)")
    p.add_argument("--repeats", type=int, default=7, help="latency repeats per point (default: 7)")
    g = p.add_argument_group("recovery of every measured edit before it is scored (costly)")
    add(g, "--recover", default="none")
    add(g, "--recover-epochs", default=1.0)
    add(p, "--allow-empty-layers", default=False)
    output_args(p, "headwise-plan", "plan.json, report.html")
    task_args(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..io import atomic_dir, check_writable_dir
    from ..planning import Budget, plan
    from ..report import Report
    from ..report.plan import add_plan_sections, verdict

    budget = Budget.parse(args.budget)  # a bad budget fails before anything loads
    methods = None if args.methods is None else tuple(m for m in args.methods.split(",") if m.strip())
    if getattr(args, "new_head", False):  # apply could not rebuild the random head the plan measured
        raise HeadwiseError(
            "plan --new-head would measure edits of an untrained, random classification head; train one first "
            f"({suggest(['mix', '--new-head', '--no-mixers', '--mix-epochs', '1', '--out', 'cls-tuned'], args)}), "
            "then plan with --model cls-tuned/model")
    check_writable_dir(args.out, args.force)
    task = task_from_args(args)
    model, tokenizer = load_task_model(args, task)
    budget.validate(model, args.allow_empty_layers)
    result = plan(model, tokenizer, task, budget, ranking=args.ranking, examples=args.importance_examples,
                  top_k=args.top_k, repeats=args.repeats, calibration=args.calibration_limit, recover=args.recover,
                  recover_epochs=args.recover_epochs, allow_empty_layers=args.allow_empty_layers, methods=methods,
                  model_name=args.model or "all-MiniLM-L6-v2", progress=None, importance_batch=args.importance_batch)
    data = result.to_dict()
    # already names the saved file (the verdict keeps it) and loads the model as this run did
    data["command"] = suggest(shlex.split(result.command(f"{args.out}/plan.json"))[1:], args, LOADING[1:])
    report = Report("headwise plan", f"{data['model']} on {task.name}, budget {budget}")
    add_plan_sections(report, data)
    with atomic_dir(args.out, args.force) as tmp:
        write_json(tmp / "plan.json", data, indent=1)
        report.write(tmp)
    if args.json:
        print_json({k: data[k] for k in ("recommended", "command", "front", "budget")})
    else:
        print(verdict(data, "plan.json").replace("**", "").replace("`", ""))
        print(f"saved {args.out}/plan.json and {args.out}/report.html")
    return 0
