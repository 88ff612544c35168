"""``headwise eval stsb``: STS Benchmark Spearman of a model (mean pooling, cosine)."""

from __future__ import annotations

import argparse
import json

from . import model_args


def register(verbs, parents) -> None:
    evaluate = verbs.add_parser("eval", parents=parents, help="evaluate a model")
    tasks = evaluate.add_subparsers(dest="task", required=True, metavar="TASK")
    stsb = tasks.add_parser("stsb", parents=parents, help="STS Benchmark Spearman (mean pooling, cosine)")
    model_args(stsb)
    stsb.add_argument("--split", default="dev", choices=["train", "dev", "test"])
    stsb.add_argument("--data", default=None, help="the STS-B .tsv file or its folder (default: shared/data/stsb)")
    stsb.add_argument("--batch-size", type=int, default=64)
    stsb.set_defaults(run=run_stsb)


def run_stsb(args: argparse.Namespace) -> int:
    from ..evaluation import ensure_encoder, evaluate_stsb, stsb_file
    from ..models import load_model, load_tokenizer

    stsb_file(args.split, args.data)  # a missing file fails before the model loads
    model, _ = load_model(args.model, args.device, args.dtype, with_tokenizer=False)
    ensure_encoder(model, "eval stsb")
    tokenizer = load_tokenizer(args.model)
    result = evaluate_stsb(model, tokenizer, args.split, args.data, args.batch_size)
    if args.json:
        print(json.dumps(result.as_dict(), indent=2))
    else:
        print(f"STS-B {result.split} ({result.pairs} pairs, {result.file})")
        print(f"  model: {args.model or 'all-MiniLM-L6-v2 (packaged)'}, attention: {model.config._attn_implementation}")
        print(f"  Spearman x100: {result.spearman:.2f}   Pearson x100: {result.pearson:.2f}")
    return 0
