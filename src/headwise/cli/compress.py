"""``headwise compress``: collaborative heads at a chosen ``D~k``, a saved model and a report."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from ..errors import HeadwiseError
from . import model_args


def register(verbs, parents) -> None:
    p = verbs.add_parser("compress", parents=parents,
                         help="collaborative heads: share one query/key projection of width --dk across heads")
    model_args(p)
    p.add_argument("--dk", type=int, required=True, help="shared query/key width (heads × head_dim is exact)")
    p.add_argument("--calibration", default=None,
                   help="STS-B .tsv file or folder, or a .txt file (one text a line): minimise the attention-score "
                        "error on these inputs instead of the weight error")
    p.add_argument("--limit", type=int, default=2000, help="calibration texts used, a seeded random sample when the file holds more (default: 2000)")
    p.add_argument("--iterations", type=int, default=20, help="ALS sweeps after the closed-form start (default: 20)")
    p.add_argument("--init", choices=["auto", "block", "hosvd"], default="auto",
                   help="closed-form start (default: auto = block with --calibration, hosvd without)")
    p.add_argument("--curve", default="auto",
                   help="comma-separated dk values for the report's trade-off curve, 'auto' or 'none'")
    p.add_argument("--finetune", type=float, default=0.0, help="epochs of STS-B re-fine-tuning (default: 0)")
    p.add_argument("--data", default=None,
                   help="STS-B folder for --finetune and evaluation (default: shared/data/stsb)")
    p.add_argument("--no-eval", action="store_true", help="skip the STS-B dev evaluations")
    p.add_argument("--out", default="headwise-compressed", help="output folder: model/, compression.json, report.html")
    p.add_argument("--force", action="store_true", help="replace a non-empty output folder")
    p.set_defaults(run=run)


def _calibration_texts(path: str, limit: int) -> list[str]:
    from ..evaluation import read_stsb

    file = Path(path)
    if file.suffix == ".txt":
        if not file.is_file():
            raise HeadwiseError(f"calibration file not found: {file} (one text per line)")
        texts = [line.strip() for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
    else:
        texts = read_stsb("train", path).sentences() if file.is_dir() else read_stsb("dev", path).sentences()
    # a sample, not the first rows: files are often sorted by source (STS-B train: its first 2000 are captions)
    return random.Random(0).sample(texts, limit) if len(texts) > limit else texts


def _curve_dks(spec: str, dk: int, exact: int) -> list[int]:
    if spec == "none":
        return []
    if spec == "auto":
        values = {max(1, round(exact * f)) for f in (1 / 6, 1 / 3, 1 / 2, 2 / 3, 1)}
    else:
        try:
            values = {int(v) for v in spec.split(",") if v.strip()}
        except ValueError:
            raise HeadwiseError(f"--curve {spec!r}: give comma-separated integers, 'auto' or 'none'") from None
    return sorted(v for v in values | {min(dk, exact)} if 0 < v <= exact)


def run(args: argparse.Namespace) -> int:
    from ..evaluation import ensure_encoder, evaluate_stsb, stsb_file
    from ..io import check_writable_dir, save_run
    from ..models import load_model, load_tokenizer
    from ..report import Report
    from ..training import finetune_stsb
    from ..sites import find_sites
    from ..collaborative import CollaborativeConfig, compress, input_moments, tradeoff
    from ..collaborative.apply import check_compressible, exact_rank
    from ..collaborative.report import add_compression_section

    if args.dk <= 0:
        raise HeadwiseError(f"--dk must be a positive integer, got {args.dk}")
    check_writable_dir(args.out, args.force)
    texts = _calibration_texts(args.calibration, args.limit) if args.calibration else None
    if args.calibration and not texts:
        raise HeadwiseError(f"the calibration set {args.calibration} holds no text")
    evaluate = not args.no_eval
    if evaluate or args.finetune:
        stsb_file("train" if args.finetune else "dev", args.data)
    model, _ = load_model(args.model, args.device, args.dtype, with_tokenizer=False)
    tokenizer = load_tokenizer(args.model) if texts or evaluate or args.finetune else None
    if evaluate or args.finetune:
        ensure_encoder(model, "headwise compress (STS-B)")
    config = CollaborativeConfig(dk=args.dk, init=args.init, iterations=args.iterations)
    sites = find_sites(model)
    check_compressible(model, sites, args.dk)
    moments = input_moments(model, sites, texts, tokenizer, config.batch_size, config.max_length) if texts else None
    exact = max(exact_rank(s) for s in sites)
    dks = _curve_dks(args.curve, args.dk, exact)
    curve = tradeoff(model, dks, config, moments=moments) if dks else []
    before = sum(p.numel() for p in model.parameters())
    metric_before = round(evaluate_stsb(model, tokenizer, "dev", args.data).spearman, 2) if evaluate else None
    result = compress(model, config=config, moments=moments)
    metric_after = round(evaluate_stsb(model, tokenizer, "dev", args.data).spearman, 2) if evaluate else None
    metric_finetuned = None
    if args.finetune:
        finetune_stsb(model, tokenizer, epochs=args.finetune, data=args.data)
        metric_finetuned = round(evaluate_stsb(model, tokenizer, "dev", args.data).spearman, 2) if evaluate else None
    summary = {
        "model": args.model or "all-MiniLM-L6-v2", "calibration": args.calibration, "config": vars(config),
        **result.as_dict(), "parameters_before": before, "parameters_after": sum(p.numel() for p in model.parameters()),
        "metric_name": "STS-B dev Spearman ×100", "metric_before": metric_before, "metric_after": metric_after,
        "metric_finetuned": metric_finetuned, "finetune_epochs": args.finetune,
        "curve": [c.as_dict() for c in curve],
    }
    report = Report("headwise compression report", f"{summary['model']}: collaborative heads, dk={result.dk}")
    add_compression_section(report, summary)
    save_run(args.out, model, tokenizer, "compression.json", summary, report, overwrite=args.force)
    if args.json:
        print(json.dumps(summary))
    else:
        metric = "" if not evaluate else f", STS-B dev {metric_before} → {metric_after}" + (
            f" → {metric_finetuned} after {args.finetune:g} epoch(s) of re-fine-tuning" if args.finetune else "")
        print(f"collaborative heads, dk={result.dk} ({result.objective} objective): query/key parameters "
              f"{result.params_before:,} → {result.params_after:,}{metric}")
        print(f"saved {args.out}/model (load with headwise.from_pretrained), {args.out}/report.html")
    return 0
