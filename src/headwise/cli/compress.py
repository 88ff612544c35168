"""``headwise compress``: collaborative heads at a chosen ``D~k`` (``headwise.workflows.compress``), a saved model and
a report."""

from __future__ import annotations

import argparse
import math
import random
from pathlib import Path

from ..errors import HeadwiseError
from . import model_args
from .options import add, config_options, output_args, runs_methods
from .recovery_options import recovery_args, recovery_of
from .task_options import load_task_model, task_args, task_from_args
from .output import print_json


def _collaborative_options(parser: argparse.ArgumentParser) -> None:
    """The fields of ``CollaborativeConfig`` the verb takes (T5: --kinds enc-self,dec-self)."""
    from ..collaborative.config import CollaborativeConfig

    config_options(parser.add_argument_group("collaborative heads (CollaborativeConfig)"), CollaborativeConfig,
                   ("dk", "kinds", "iterations", "init"), keep_defaults=True)


# what each page of this verb shows under "examples:" (tests/test_cli_help.py parses every line)
EXAMPLES: dict[str, tuple[str, ...]] = {
    "compress": ("headwise compress --dk 192 --out minilm-compress",),
}


def register(verbs, parents) -> None:
    p = verbs.add_parser("compress", parents=parents,
                         help="collaborative heads: share one query/key projection of width --dk across heads")
    p.later(lambda parser: runs_methods(parser, "headwise.collaborative"))
    model_args(p)
    p.later(_collaborative_options)
    p.add_argument("--calibration", default=None,
                   help="STS-B .tsv file or folder, a .txt file (one text a line), or 'task' (the task's "
                        "calibration split): minimise the attention-score error on these inputs instead of the weight "
                        "error")
    add(p, "--calibration-limit", default=2000)
    p.add_argument("--curve", default="auto",
                   help="comma-separated dk values for the report's trade-off curve, 'auto' or 'none'")
    add(p, "--no-eval")
    output_args(p, "headwise-compressed", "model/, compression.json, report.html")
    recovery_args(p)
    task_args(p)
    p.set_defaults(run=run)


def _calibration_texts(path: str, limit: int) -> list[str]:
    from ..io import read_text
    from ..tasks import read_stsb

    file = Path(path)
    if file.suffix == ".txt":
        if not file.is_file():
            raise HeadwiseError(f"calibration file not found: {file} (one text per line)")
        texts = [line.strip() for line in read_text(file).splitlines() if line.strip()]
    else:
        texts = read_stsb("train", path).sentences() if file.is_dir() else read_stsb("dev", path).sentences()
    # a sample, not the first rows: files are often sorted by source (STS-B train: its first 2000 are captions)
    return random.Random(0).sample(texts, limit) if len(texts) > limit else texts


def _dk(text: str) -> int | float:
    """``--dk``: a positive width, or a fraction strictly between 0 and 1."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if value.is_integer() and value >= 1:
        return int(value)
    if 0 < value < 1:
        return value
    raise HeadwiseError(f"--dk {text}: give a positive integer width (e.g. 96) or a fraction 0 < dk < 1 of each "
                        "layer's heads × head_dim (e.g. 0.25)")


def _curve_dks(spec: str, dk: int | float, exact: int) -> list[int | float]:
    """The trade-off curve's widths: counts, or fractions of each site's width when ``dk`` is one."""
    fraction = isinstance(dk, float)
    if spec == "none":
        return []
    if spec == "auto":
        shares = (1 / 6, 1 / 3, 1 / 2, 2 / 3)
        values = set(shares) if fraction else {max(1, round(exact * f)) for f in (*shares, 1)}
    else:
        try:
            values = {(float if fraction else int)(v) for v in spec.split(",") if v.strip()}
        except ValueError:
            kind = "fractions between 0 and 1" if fraction else "integers"
            raise HeadwiseError(f"--curve {spec!r}: give comma-separated {kind}, 'auto' or 'none'") from None
    values.add(dk if fraction else min(dk, exact))
    return sorted(v for v in values if (0 < v < 1 if fraction else 0 < v <= exact))


def run(args: argparse.Namespace) -> int:
    from ..collaborative.compression import exact_rank
    from ..collaborative.config import CollaborativeConfig
    from ..io import check_writable_dir
    from ..report import Report
    from ..report.compression import add_compression_section
    from ..sites import select_sites
    from ..workflows.compress import compress_heads
    from .output import save_run

    args.dk = _dk(args.dk)
    recovery = recovery_of(args)
    check_writable_dir(args.out, args.force)
    from_task = args.calibration == "task"
    texts = _calibration_texts(args.calibration, args.calibration_limit) if args.calibration and not from_task else None
    if args.calibration and not from_task and not texts:
        raise HeadwiseError(f"the calibration set {args.calibration} holds no text")
    evaluate = not args.no_eval
    task = task_from_args(args) if evaluate or recovery.mode != "none" or from_task else None
    # the head of --task also without evaluation; calibration texts need the tokenizer
    model, tokenizer = load_task_model(args, task, need_tokenizer=bool(texts))
    config = CollaborativeConfig(dk=args.dk, init=args.init, iterations=args.iterations, kinds=args.kinds)
    calibration = task.calibration_inputs(tokenizer, limit=args.calibration_limit, batch_size=config.batch_size) \
        if from_task else texts
    dks = _curve_dks(args.curve, args.dk, max(exact_rank(s) for s in select_sites(model, args.kinds)))
    summary = compress_heads(model, tokenizer, task, config, calibration=calibration, curve=dks, recovery=recovery,
                             evaluate=evaluate, model_name=args.model or "all-MiniLM-L6-v2",
                             calibration_name=args.calibration)
    report = Report("headwise compression report", f"{summary['model']}: collaborative heads, dk={summary['dk']}")
    add_compression_section(report, summary)
    save_run(args.out, model, tokenizer, "compression.json", summary, report, overwrite=args.force)
    if args.json:
        print_json(summary)
    else:
        before, edited, recovered = summary["metric_before"], summary["metric_edited"], summary["metric_recovered"]
        name = "" if task is None else {"stsb": "STS-B dev"}.get(task.name, task.metric)
        metric_text = "" if not evaluate else f", {name} {before} → {edited}" + (
            f" → {recovered} after {recovery.mode} recovery" if recovered is not None else "")
        print(f"collaborative heads, dk={summary['dk']} ({summary['objective']} objective): query/key parameters "
              f"{summary['params_before']:,} → {summary['params_after']:,}{metric_text}")
        print(f"saved {args.out}/model (load with headwise.from_pretrained), {args.out}/report.html")
    return 0
