"""``headwise mix``: swap heads (MHR) and optionally train alpha mixers with the nuclear-norm term, then fold them;
a saved model, mixing.json and a report."""

from __future__ import annotations

import argparse
import dataclasses

from ..errors import HeadwiseError
from . import model_args
from .options import add, config_options, output_args, runs_methods
from .task_options import (load_task_model, metric_label, model_costs, run_record, task_args, task_from_args,
                           task_metric)
from .output import print_json


def _training_options(parser: argparse.ArgumentParser) -> None:
    """How the mixers train: the fields of ``NuclearNormTraining`` (γ 1 here: the verb's mixers are meant to move)."""
    from ..mixing.config import NuclearNormTraining

    config_options(parser.add_argument_group("training of the mixers (NuclearNormTraining)"), NuclearNormTraining,
                   defaults={"gamma": 1.0}, keep_defaults=True)


# what each page of this verb shows under "examples:" (tests/test_cli_help.py parses every line)
EXAMPLES: dict[str, tuple[str, ...]] = {
    "mix": ("headwise mix --swap 'enc-self.0:0 <-> enc-self.1:1' --out minilm-mix",
            "headwise mix --task classification --data genre.csv --new-head --no-mixers --mix-epochs 1 "
            "--out cls-tuned   # fine-tune a classifier"),
}


def register(verbs, parents) -> None:
    p = verbs.add_parser("mix", parents=parents, help="swap heads and/or fine-tune with head mixers (MHR), folded into plain weights")
    p.later(lambda parser: runs_methods(parser, "headwise.mixing"))
    model_args(p)
    p.add_argument("--swap", action="append", default=[], metavar="'SITE:HEAD <-> SITE:HEAD'",
                   help="exchange two heads' q/k/v weights (repeatable), e.g. 'enc-self.1:3 <-> enc-self.4:0'")
    p.add_argument("--include-output", action="store_true", help="swap the heads' output-projection columns too")
    p.add_argument("--mix-epochs", type=float, default=0.0,
                   help="epochs of fine-tuning on the task with alpha mixers on every site, folded afterwards "
                        "(default: 0)")
    p.later(_training_options)
    p.add_argument("--no-mixers", action="store_true",
                   help="fine-tune without alpha mixers: the swapped model trains as it is (MHR's static swap), or, "
                        "with no --swap, a plain fine-tune with the same updates (the control)")
    add(p, "--no-eval")
    output_args(p, "headwise-mixed", "model/, mixing.json, report.html")
    task_args(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..io import check_writable_dir
    from ..mixing import (MixingConfig, NuclearNormPenalty, NuclearNormTraining, add_mixers, alpha_table, fold_mixing,
                          resolve, swap_heads)
    from ..report import Report
    from ..report.mixing import add_mixing_section
    from ..training import finetune
    from .output import save_run

    if not args.swap and not args.mix_epochs:
        raise HeadwiseError("nothing to do: give --swap 'SITE:HEAD <-> SITE:HEAD' and/or --mix-epochs EPOCHS")
    if args.mix_epochs < 0 or args.gamma < 0:
        raise HeadwiseError("--mix-epochs and --gamma must be ≥ 0")
    if args.no_mixers and not args.mix_epochs:
        raise HeadwiseError("--no-mixers changes fine-tuning; give --mix-epochs EPOCHS with it")
    check_writable_dir(args.out, args.force)
    evaluate = not args.no_eval
    task = task_from_args(args) if evaluate or args.mix_epochs else None  # bad data fails before the model loads
    model, tokenizer = load_task_model(args, task)
    resolve(model, args.swap)  # every swap is checked before the first change or any slow work

    def metric() -> float | None:
        return task_metric(task, model, tokenizer) if evaluate else None

    before, costs = metric(), model_costs(model)
    result = {"model": args.model or "all-MiniLM-L6-v2", "swaps": list(args.swap),
              "include_output": args.include_output, "metric_before": before, "mix_epochs": args.mix_epochs, "mixers": bool(args.mix_epochs) and
              not args.no_mixers, "gamma": None if args.no_mixers else args.gamma}
    swap_heads(model, args.swap, include_output=args.include_output)
    result["metric_after_swaps"] = metric() if args.swap else result["metric_before"]
    report = Report("headwise mixing report", f"{result['model']}: head swaps and mixing")
    if args.mix_epochs and args.no_mixers:
        finetune(model, tokenizer, task, epochs=args.mix_epochs)
    elif args.mix_epochs:
        add_mixers(model, MixingConfig())
        fields = dataclasses.fields(NuclearNormTraining)
        training = NuclearNormTraining(**{f.name: getattr(args, f.name) for f in fields})
        term = NuclearNormPenalty(model, training)
        finetune(model, tokenizer, task, epochs=args.mix_epochs, penalties=[term], callbacks=[term])
        alphas = alpha_table(model)
        add_mixing_section(report, {"alphas": alphas})
        result["nuclear_norms"] = {name: a["nuclear_norm"] for name, a in alphas.items()}
        fold_mixing(model)
    result.update(run_record(task, before, metric(), None, costs, model))  # mixing trains: no recovery after it
    report.add_section("Swaps", "Heads exchanged, in order (q/k/v weights"
                       + (" and output columns)." if args.include_output else ").")).table(
        [[s] for s in args.swap] or [["none"]], ["swap"])
    save_run(args.out, model, tokenizer, "mixing.json", result, report, overwrite=args.force)
    if args.json:
        print_json(result)
    else:
        tuned = "" if not args.mix_epochs else f", {args.mix_epochs:g} epoch(s) " + (
            "fine-tuned" if args.no_mixers else "with mixers (folded)")
        print(f"{len(args.swap)} swap(s)" + tuned
              + ("" if not evaluate else f", {metric_label(task)} {result['metric_before']} → {result['metric_edited']}"))
        print(f"saved {args.out}/model (load with headwise.from_pretrained), {args.out}/report.html")
    return 0
