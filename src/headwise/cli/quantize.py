"""``headwise quantize``: sweep pruning thresholds and quantizers × bits, write results.json and report.html."""

from __future__ import annotations

import argparse

from ..errors import HeadwiseError
from .task_options import load_task_model, model_costs, run_record, task_args, task_from_args
from . import model_args
from .options import add, alias, config_options, output_args, runs_methods
from .output import print_json, write_json


def parse_bits(text: str) -> tuple[int, ...]:
    """``"1..8"``, ``"2,3,8"`` or ``"3"`` → bit widths (each checked later, 1..16)."""
    out: list[int] = []
    try:
        for part in (p.strip() for p in text.split(",") if p.strip()):
            lo, _, hi = part.partition("..")
            out += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    except ValueError:
        raise HeadwiseError(f"--bit-widths {text!r}: give a range such as 1..8 or a list such as 2,3,8") from None
    if not out:
        raise HeadwiseError("--bit-widths is empty; give e.g. 1..8")
    bad = [b for b in out if not 1 <= b <= 16]
    if bad:
        raise HeadwiseError(f"--bit-widths {text!r}: bits must be from 1 to 16, got {bad[0]}")
    return tuple(dict.fromkeys(out))


def parse_floats(text: str, flag: str) -> tuple[float, ...]:
    try:
        return tuple(float(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise HeadwiseError(f"{flag} {text!r}: give comma-separated numbers such as 0.001,0.01,0.1") from None


def parse_methods(text: str) -> tuple[str, ...]:
    from ..quantization.functional import QUANTIZERS

    if text.strip() == "none":
        return ()  # the threshold sweep alone
    return tuple(QUANTIZERS) if text.strip() in ("all", "") else tuple(m.strip() for m in text.split(",") if m.strip())


def chosen_setting(result: dict, method: str | None) -> dict | None:
    """The row ``--save-model`` applies: of ``method`` (default: every quantizer), the setting with the fewest bits
    within tolerance (the higher metric on a tie); None when no such setting exists."""
    rows = [r for r in result["rows"] if r["within"] and r["bits"] is not None and method in (None, r["method"])]
    return min(rows, key=lambda r: (r["bits"], -r["metric"]), default=None)


def cmd_quantize(args: argparse.Namespace) -> int:
    from ..io import atomic_dir, check_writable_dir, save_pretrained
    from ..quantization import quantize_attention
    from ..report.quantization import write_quantization_report
    from ..quantization.config import QuantizationConfig
    from ..quantization.sweep import SweepConfig, sweep

    base = QuantizationConfig(threshold=args.threshold, renormalize=args.renormalize, floor=args.floor,
                              top_edge=args.top_edge, scope=args.scope, zeros=args.zeros, bin_value=args.bin_value)
    thresholds = () if args.thresholds.strip() == "none" else parse_floats(args.thresholds, "--thresholds")
    config = SweepConfig(methods=parse_methods(args.methods), bits=parse_bits(args.bits), thresholds=thresholds,
                         base=base, tolerance=args.tolerance)
    if args.limit is not None and args.limit < 1:
        raise HeadwiseError(f"--limit must be at least 1, got {args.limit}")
    if args.save_method is not None and args.save_method not in config.methods:
        raise HeadwiseError(f"--save-method {args.save_method} is not among the swept --quantizers "
                            f"({', '.join(config.methods) or 'none'})")
    check_writable_dir(args.out, args.force)  # before any slow work
    task = task_from_args(args)  # bad data fails before the model loads
    model, tokenizer = load_task_model(args, task)
    metric = task.metric_fn(tokenizer)
    if task.name == "stsb":
        metric.__name__ = f"STS-B {task.split} Spearman x100" + (f" (first {task.limit} pairs)" if task.limit else "")
    costs = model_costs(model)
    result = sweep(model, config, metric=metric).to_dict()
    result["task"] = task.name
    result["model"] = args.model or "all-MiniLM-L6-v2 (packaged)"
    row = chosen_setting(result, args.save_method) if args.save_model else None
    if args.save_model and row is None:
        raise HeadwiseError(f"no setting of {args.save_method or 'any quantizer'} stayed within "
                            f"{100 * args.tolerance:g}% of the baseline: nothing to save (raise --tolerance or "
                            "widen --bit-widths)")
    if row is not None:
        quantize_attention(model, next(s for s in config.settings() if s.label == row["label"]))
        result["saved_setting"] = row["label"]
        sign = 1 if task.higher_is_better else -1  # the sweep maximises ±metric
        result.update(run_record(task, sign * result["baseline"], sign * row["metric"], None, costs, model))
    with atomic_dir(args.out, overwrite=args.force) as tmp:
        write_json(tmp / "results.json", result, indent=1)
        write_quantization_report(result, tmp)
        if row is not None:
            save_pretrained(model, tmp / "model", tokenizer=tokenizer)
    if args.json:
        print_json(result)
        return 0
    print(f"{result['metric_name']}: baseline {result['baseline']:.2f}, {len(result['rows'])} settings; "
          f"within {100 * args.tolerance:g}% means >= "
          f"{result['baseline'] - args.tolerance * abs(result['baseline']):.2f}")
    print(f"{'method':32} {'fewest bits':>11} {'max pruned':>10}  at")
    for s in result["summary"]:
        fewest = "-" if s["fewest_bits"] is None else str(s["fewest_bits"])
        pruned = "-" if s["max_sparsity"] is None else f"{100 * s['max_sparsity']:.1f}%"
        print(f"{s['method']:32} {fewest:>11} {pruned:>10}  {s['max_sparsity_setting'] or ''}")
    if row is not None:
        print(f"saved {args.out}/model: {row['label']} ({result['metric_name']} {row['metric']:.2f})")
    print(f"report: {args.out}/report.html, numbers: {args.out}/results.json")
    return 0


def _quantizer_options(parser: argparse.ArgumentParser) -> None:
    """What every quantizer of the sweep does besides its quantizer and bits: the fields of ``QuantizationConfig``."""
    from ..quantization.config import QuantizationConfig

    config_options(parser.add_argument_group("every quantizer (QuantizationConfig)"), QuantizationConfig,
                   ("threshold", "renormalize", "floor", "top_edge", "scope", "zeros", "bin_value"),
                   keep_defaults=True)


# what each page of this verb shows under "examples:" (tests/test_cli_help.py parses every line)
EXAMPLES: dict[str, tuple[str, ...]] = {
    "quantize": ("headwise quantize --quantizers log --bit-widths 3,4 --thresholds none --limit 200 "
                 "--out minilm-quantize",),
}


def register(verbs: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    p = verbs.add_parser("quantize", parents=parents,
                         help="sweep attention-probability quantization and thresholds (SPIQA) on the task: "
                              "report.html + results.json")
    p.later(lambda parser: runs_methods(parser, "headwise.quantization"))
    model_args(p)
    g = p.add_argument_group("the sweep")
    g.add_argument("--quantizers", dest="methods", default="all",
                   help="comma-separated quantizers, all (default), or none (only the --thresholds sweep); see "
                        "docs/quantization.md")
    alias(g, "--methods", "--quantizers", "methods")
    g.add_argument("--bit-widths", dest="bits", default="1..8",
                   help="bit widths swept: a range 1..8 (default) or a list 2,3,8 (1 to 16)")
    alias(g, "--bits", "--bit-widths", "bits")
    g.add_argument("--thresholds", default="1e-4,1e-3,3e-3,0.01,0.02,0.03,0.05,0.1,0.2",
                   help="pruning-only thresholds in [0, 1), comma-separated, or none")
    g.add_argument("--tolerance", type=float, default=0.01, help="relative metric drop allowed (default 0.01)")
    p.later(_quantizer_options)  # every quantizer of the sweep: QuantizationConfig's fields
    output_args(p, "headwise-quantization", "report.html, results.json and, with --save-model, model/")
    add(p, "--save-model")
    p.add_argument("--save-method", default=None, metavar="METHOD",
                   help="--save-model: take the fewest-bits setting of this quantizer (default: of any)")
    task_args(p)
    p.set_defaults(run=cmd_quantize)
