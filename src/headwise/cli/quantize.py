"""``headwise quantize``: sweep pruning thresholds and quantizers × bits, write results.json and report.html."""

from __future__ import annotations

import argparse

from ..errors import HeadwiseError
from .task_options import load_task_model, model_costs, run_record, task_args, task_from_args
from . import model_args
from .output import print_json, write_json


def parse_bits(text: str) -> tuple[int, ...]:
    """``"1..8"``, ``"2,3,8"`` or ``"3"`` → bit widths (each checked later, 1..16)."""
    out: list[int] = []
    try:
        for part in (p.strip() for p in text.split(",") if p.strip()):
            lo, _, hi = part.partition("..")
            out += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    except ValueError:
        raise HeadwiseError(f"--bits {text!r}: give a range such as 1..8 or a list such as 2,3,8") from None
    if not out:
        raise HeadwiseError("--bits is empty; give e.g. 1..8")
    bad = [b for b in out if not 1 <= b <= 16]
    if bad:
        raise HeadwiseError(f"--bits {text!r}: bits must be from 1 to 16, got {bad[0]}")
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
        raise HeadwiseError(f"--save-method {args.save_method} is not among the swept --methods "
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
                            "widen --bits)")
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


def register(verbs: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    p = verbs.add_parser("quantize", parents=parents,
                         help="sweep attention-probability quantization and thresholds (SPIQA) on the task: "
                              "report.html + results.json")
    model_args(p)
    p.add_argument("--methods", default="all",
                   help="comma-separated quantizers, all (default), or none (only the --thresholds sweep); see "
                        "docs/quantization.md")
    p.add_argument("--bits", default="1..8", help="bit widths: a range 1..8 (default) or a list 2,3,8 (1 to 16)")
    p.add_argument("--thresholds", default="1e-4,1e-3,3e-3,0.01,0.02,0.03,0.05,0.1,0.2",
                   help="pruning-only thresholds in [0, 1), comma-separated, or none")
    p.add_argument("--threshold", type=float, default=0.0,
                   help="pruning threshold applied before every quantizer (default 0: none)")
    p.add_argument("--renormalize", action="store_true", help="renormalise rows after pruning (off in the seed)")
    p.add_argument("--floor", type=float, default=1e-3, help="pruning floor of the quantizers with pruning")
    p.add_argument("--top-edge", default="reference", choices=["reference", "clamp"],
                   help="inputs of exactly 1.0: as published (reference) or the top level (clamp)")
    p.add_argument("--scope", default="tensor", choices=["tensor", "example", "row"],
                   help="population of data-dependent bins: the layer's batch (tensor, published), each example; "
                        "row: binarization per row")
    p.add_argument("--zeros", default="reference", choices=["reference", "keep"],
                   help="uniform_slog_mean: exact zeros take the lowest level (reference) or stay 0 (keep)")
    p.add_argument("--bin-value", default="reference", choices=["reference", "mean"],
                   help="uniform_slinear_clamped_mean: bin midpoints (reference) or bin means")
    p.add_argument("--tolerance", type=float, default=0.01, help="relative metric drop allowed (default 0.01)")
    p.add_argument("--out", default="headwise-quantization", help="output folder (default: headwise-quantization)")
    p.add_argument("--save-model", action="store_true",
                   help="also write OUT/model: the model with the setting of fewest bits within --tolerance")
    p.add_argument("--save-method", default=None, metavar="METHOD",
                   help="--save-model: take the fewest-bits setting of this quantizer (default: of any)")
    p.add_argument("--force", action="store_true", help="replace a non-empty output folder")
    task_args(p)
    p.set_defaults(run=cmd_quantize)
