"""``headwise <verb>``: the command line. Errors print one line (a traceback only with --debug)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Callable

from .errors import HeadwiseError

Command = Callable[[argparse.Namespace], int]

# Method packages that add verbs: each module has ``register(verbs, parents)`` and imports heavy code lazily.
PLUGINS: tuple[str, ...] = ("headwise.pruning.command", "headwise.quantization.command",
                           "headwise.mechanisms.command", "headwise.collaborative.command",)


def model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None,
                        help="hub name or local folder (default: the packaged all-MiniLM-L6-v2)")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu, cuda, cuda:1 (default: cpu)")
    parser.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: the checkpoint's)")


def cmd_sites(args: argparse.Namespace) -> int:
    from .models import load_model
    from .sites import find_sites

    model, _ = load_model(args.model, args.device, args.dtype, with_tokenizer=False)
    sites = find_sites(model)
    if args.json:
        print(json.dumps([s.describe() for s in sites], indent=2))
        return 0
    print(f"{type(model).__name__} ({model.config.model_type}): {len(sites)} attention sites, "
          f"{sum(s.num_heads for s in sites)} heads")
    header = ("site", "path", "kind", "layers", "heads", "kv", "d", "positions", "causal", "notes")
    rows = [(s.name, s.path, s.kind, ",".join(map(str, s.layers)) if s.shared else str(s.layer), str(s.num_heads),
             str(s.num_kv_heads), str(s.head_dim), s.positions, "yes" if s.causal else "no", "; ".join(s.notes))
            for s in sites]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0


def cmd_eval_stsb(args: argparse.Namespace) -> int:
    from .tasks import ensure_encoder, evaluate_stsb, stsb_file
    from .models import load_model, load_tokenizer

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


def _texts(args: argparse.Namespace) -> tuple[list[str], tuple | None, str]:
    """Texts to analyse, STS-B pairs for the gradient objective (or None), and a description of the data."""
    from pathlib import Path

    from .tasks import read_stsb, stsb_file

    if args.data and Path(args.data).suffix == ".txt":
        path = Path(args.data)
        if not path.is_file():
            raise HeadwiseError(f"text file not found: {path} (one text per line)")
        texts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        pairs, name = None, str(path)
    else:
        data = read_stsb(args.split, args.data)
        texts, name = data.sentences(), f"STS-B {args.split} ({stsb_file(args.split, args.data).name})"
        pairs = (data.first, data.second, data.scores)
    if args.limit:
        texts = texts[: args.limit]
        pairs = None if pairs is None else tuple(p[: args.limit] for p in pairs)
    if not texts:
        raise HeadwiseError(f"{args.data} holds no text to analyse")
    return texts, pairs, f"{name}, {len(texts)} texts"


def cmd_analyze(args: argparse.Namespace) -> int:
    from .analysis import AnalysisConfig, analyze
    from .io import atomic_dir, check_writable_dir
    from .models import load_model
    from .report import write_report

    importance = () if args.importance == "none" else tuple(k for k in args.importance.split(",") if k)
    config = AnalysisConfig(batch_size=args.batch_size, max_length=args.max_length, examples=args.examples,
                            importance=importance, ablation_texts=args.ablation_texts, model_name=args.model or "all-MiniLM-L6-v2 (packaged)")
    check_writable_dir(args.out, args.force)  # before any slow work
    texts, pairs, data_name = _texts(args)
    config.data_name = data_name
    model, tokenizer = load_model(args.model, args.device, args.dtype)
    stats = analyze(model, tokenizer, texts, config, pairs=pairs).to_dict()
    with atomic_dir(args.out, overwrite=args.force) as tmp:
        (tmp / "stats.json").write_text(json.dumps(stats))
        write_report(stats, tmp)
    if args.json:
        print(json.dumps(stats))
    else:
        print(f"analysed {stats['sentences']} texts ({stats['tokens']} tokens) with {model.config.model_type}: "
              f"{args.out}/report.html, {args.out}/stats.json")
    return 0


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show tracebacks")
    common.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser = argparse.ArgumentParser(prog="headwise", parents=[common],
                                     description="Find, measure and edit the attention heads of transformers models.")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    sites = verbs.add_parser("sites", parents=[common], help="list a model's attention sites")
    model_args(sites)
    sites.set_defaults(run=cmd_sites)

    analysis = verbs.add_parser("analyze", parents=[common],
                                help="per-head statistics and importance, as report.html + stats.json")
    model_args(analysis)
    analysis.add_argument("--data", default=None,
                          help="STS-B .tsv file or folder (default: shared/data/stsb), or a .txt file, one text a line")
    analysis.add_argument("--split", default="dev", choices=["train", "dev", "test"], help="STS-B split")
    analysis.add_argument("--limit", type=int, default=None, help="analyse only the first N texts")
    analysis.add_argument("--out", default="headwise-report", help="output folder (default: headwise-report)")
    analysis.add_argument("--force", action="store_true", help="replace a non-empty output folder")
    analysis.add_argument("--importance", default="gradient,ablation",
                          help="comma-separated: gradient, ablation; or none (default: gradient,ablation)")
    analysis.add_argument("--ablation-texts", type=int, default=256,
                          help="texts used by ablation importance, one pass per head (default: 256)")
    analysis.add_argument("--examples", type=int, default=3, help="sentences whose attention maps are kept")
    analysis.add_argument("--batch-size", type=int, default=32)
    analysis.add_argument("--max-length", type=int, default=None)
    analysis.set_defaults(run=cmd_analyze)

    evaluate = verbs.add_parser("eval", parents=[common], help="evaluate a model")
    tasks = evaluate.add_subparsers(dest="task", required=True, metavar="TASK")
    stsb = tasks.add_parser("stsb", parents=[common], help="STS Benchmark Spearman (mean pooling, cosine)")
    model_args(stsb)
    stsb.add_argument("--split", default="dev", choices=["train", "dev", "test"])
    stsb.add_argument("--data", default=None, help="the STS-B .tsv file or its folder (default: shared/data/stsb)")
    stsb.add_argument("--batch-size", type=int, default=64)
    stsb.set_defaults(run=cmd_eval_stsb)

    for plugin in PLUGINS:
        importlib.import_module(plugin).register(verbs, [common])
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # headwise shows its own progress for long work
    try:
        return args.run(args)
    except HeadwiseError as err:
        if args.debug:
            raise
        print(f"headwise: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("headwise: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
