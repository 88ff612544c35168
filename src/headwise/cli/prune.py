"""``headwise prune``: L0, importance or fixed-mask pruning, then physical removal, a saved model and a report."""

from __future__ import annotations

import argparse
import json

from ..errors import HeadwiseError
from . import model_args

METHODS = ("l0", "importance", "mask")


def register(verbs, parents) -> None:
    p = verbs.add_parser("prune", parents=parents, help="remove attention heads (L0 gates, importance or a mask)")
    model_args(p)
    p.add_argument("--method", choices=METHODS, default="l0", help="how to choose the heads (default: l0)")
    p.add_argument("--keep", type=int, default=None, help="number of heads to keep (l0, importance)")
    p.add_argument("--mask", default=None, help="JSON/YAML file of 0/1 head masks (method mask)")
    p.add_argument("--iterative", action="store_true", help="importance: recompute importance after each step")
    p.add_argument("--step", type=int, default=None, help="importance: heads masked per step (default: 10%%)")
    p.add_argument("--epochs", type=float, default=1.0, help="l0: epochs of joint training on STS-B train")
    p.add_argument("--max-steps", type=int, default=-1, help="l0: stop joint training after N steps (quick trials)")
    p.add_argument("--importance-pairs", type=int, default=256,
                   help="importance: STS-B train pairs for gradient importance (default: 256)")
    p.add_argument("--finetune", type=float, default=0.0,
                   help="epochs of STS-B fine-tuning after removal (default: 0)")
    p.add_argument("--data", default=None, help="STS-B folder (default: shared/data/stsb)")
    p.add_argument("--allow-empty-layers", action="store_true",
                   help="allow removing every head of a layer (its attention sublayer then only adds its bias)")
    p.add_argument("--no-eval", action="store_true", help="skip the STS-B dev evaluations")
    p.add_argument("--out", default="headwise-pruned", help="output folder: model/, pruning.json, report.html")
    p.add_argument("--force", action="store_true", help="replace a non-empty output folder")
    p.set_defaults(run=run)


def _check(args: argparse.Namespace) -> None:
    if args.method == "mask":
        if not args.mask:
            raise HeadwiseError("--method mask needs --mask FILE (JSON/YAML: site or kind -> 0/1 per head)")
    elif args.keep is None or args.keep < 1:
        raise HeadwiseError(f"--method {args.method} needs --keep N with N ≥ 1 (the number of heads to keep)")
    if args.epochs <= 0 or args.finetune < 0:
        raise HeadwiseError("--epochs must be > 0 and --finetune ≥ 0")


def run(args: argparse.Namespace) -> int:
    from ..evaluation import ensure_encoder, evaluate_stsb, stsb_file
    from ..io import check_writable_dir, save_run
    from ..models import load_model
    from ..report import Report
    from ..report.pruning import add_pruning_section
    from ..sites import find_sites
    from ..training import finetune_stsb
    from ..pruning import apply_masks, importance_prune, l0_prune, load_masks, prune_masked

    _check(args)
    check_writable_dir(args.out, args.force)
    spec = load_masks(args.mask) if args.method == "mask" else None
    needs_data = args.method != "mask" or args.finetune or not args.no_eval
    if needs_data:
        stsb_file("train" if args.method != "mask" or args.finetune else "dev", args.data)
    model, tokenizer = load_model(args.model, args.device, args.dtype)
    if needs_data:
        ensure_encoder(model, "headwise prune (STS-B)")
    sites = find_sites(model)
    names = [s.name for s in sites]
    before = {"heads": sum(s.num_heads for s in sites), "parameters": sum(p.numel() for p in model.parameters())}
    if args.keep is not None and args.keep > before["heads"]:
        raise HeadwiseError(f"--keep {args.keep} is more than the model's {before['heads']} heads")

    def metric(m) -> float:
        return round(evaluate_stsb(m, tokenizer, "dev", args.data).spearman, 2)

    metric_before = None if args.no_eval else metric(model)
    curve = []
    if args.method == "mask":
        apply_masks(model, spec)
        removed = prune_masked(model, args.allow_empty_layers)
    elif args.method == "importance":
        steps = importance_prune(model, tokenizer, args.keep, iterative=args.iterative, step=args.step,
                                 importance_pairs=args.importance_pairs, metric=None if args.no_eval else metric,
                                 data=args.data)
        curve = [[s.kept, s.metric] for s in steps.steps]
        by_path = {s.path: s.name for s in sites}
        removed = {by_path[p]: [h for h, m in enumerate(mask) if not m] for p, mask in steps.steps[-1].masks.items()}
    else:
        removed = l0_prune(model, tokenizer, args.keep, epochs=args.epochs, max_steps=args.max_steps, data=args.data)
    if args.finetune:
        finetune_stsb(model, tokenizer, epochs=args.finetune, data=args.data)
    after_sites = find_sites(model)
    result = {
        "method": args.method + (" (iterative)" if args.iterative else ""), "model": args.model or "all-MiniLM-L6-v2",
        "heads_before": before["heads"], "heads_after": sum(s.num_heads for s in after_sites),
        "parameters_before": before["parameters"], "parameters_after": sum(p.numel() for p in model.parameters()),
        "removed": {n: removed.get(n, []) for n in names},
        "survivors": {s.name: [0 if h in removed.get(s.name, []) else 1 for h in range(s.num_heads)] for s in sites},
        "metric_name": "STS-B dev Spearman ×100", "metric_before": metric_before,
        "metric_after": None if args.no_eval else metric(model), "curve": curve,
    }
    report = Report("headwise pruning report", f"{result['model']}: {result['method']} pruning")
    add_pruning_section(report, result)
    save_run(args.out, model, tokenizer, "pruning.json", result, report, overwrite=args.force)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{result['method']}: {result['heads_before']} → {result['heads_after']} heads, "
              f"{result['parameters_before']:,} → {result['parameters_after']:,} parameters"
              + ("" if args.no_eval else f", STS-B dev {metric_before} → {result['metric_after']}"))
        print(f"saved {args.out}/model (load with headwise.from_pretrained), {args.out}/report.html")
    return 0
