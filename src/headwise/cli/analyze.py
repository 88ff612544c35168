"""``headwise analyze``: per-head statistics and importance on texts, written as report.html + stats.json."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import HeadwiseError
from . import model_args
from .options import add
from .suggest import run_options
from .task_options import load_for_task, load_task_model, task_args, task_from_args
from .output import print_json, write_json


IMPORTANCE_EXAMPLES = 32
ACTIVATIONS = {"auto": None, "keep": False, "recompute": True}  # --activations → AnalysisConfig.recompute


# what each page of this verb shows under "examples:" (tests/test_cli_help.py parses every line)
EXAMPLES: dict[str, tuple[str, ...]] = {
    "analyze": ("headwise analyze --limit 200 --out minilm-analyze",
                "headwise analyze --task lm --model smollm2-135m --max-length 256 --limit 50 --out smol-analyze"),
}


def register(verbs, parents) -> None:
    p = verbs.add_parser("analyze", parents=parents,
                         help="per-head statistics and importance, as report.html + stats.json")
    model_args(p)
    add(p, "--data", default=None, shown="the task's own")
    add(p, "--split", default=None, shown="the task's evaluated split")
    add(p, "--limit", default=None)
    add(p, "--out", default="headwise-report")
    add(p, "--force")
    p.add_argument("--importance", default=None,
                   help="comma-separated: gradient, ablation; or none (default: gradient, one backward pass per "
                        "batch; ablation costs one pass per head over --ablation-texts; translation: gradient of the "
                        "label loss)")
    p.add_argument("--ablation-texts", type=int, default=256,
                   help="texts used by ablation importance, one pass per head (default: 256)")
    p.add_argument("--activations", choices=ACTIVATIONS, default="auto",
                   help="gradient in the statistics pass: keep every block's activations for the backward, or "
                        "recompute them within a memory margin of 0.2x the weights (blocks; at long context decoder "
                        "layers one at a time with their inputs on disk, or segments of blocks; one or two more "
                        "forwards); auto keeps them when they fit "
                        "that margin (default: auto)")
    p.add_argument("--examples", type=int, default=3, help="sentences whose attention maps are kept (default: 3)")
    p.add_argument("--example-tokens", type=int, default=64,
                   help="each kept sentence's maps cover its first N tokens (default: 64)")
    add(p, "--batch-size", default=32)
    add(p, "--max-length", default=None, shown="1024 for lm, 128 otherwise")
    add(p, "--importance-examples", default=None, shown=str(IMPORTANCE_EXAMPLES))
    task_args(p)
    p.set_defaults(run=run)


def _texts(args: argparse.Namespace) -> tuple[list[str], tuple | None, str]:
    """Texts to analyse, STS-B pairs for the gradient objective (or None), and a description of the data."""
    from ..io import read_text
    from ..tasks import read_stsb, stsb_file

    if args.data and Path(args.data).suffix == ".txt":
        path = Path(args.data)
        if not path.is_file():
            raise HeadwiseError(f"text file not found: {path} (one text per line)")
        texts = [line.strip() for line in read_text(path).splitlines() if line.strip()]
        pairs, name = None, str(path)
    else:
        split = args.split or "dev"
        data = read_stsb(split, args.data)
        texts, name = data.sentences(), f"STS-B {split} ({stsb_file(split, args.data).name})"
        pairs = (data.first, data.second, data.scores)
    if args.limit:
        texts = texts[: args.limit]
        pairs = None if pairs is None else tuple(p[: args.limit] for p in pairs)
    if not texts:
        raise HeadwiseError(f"{args.data} holds no text to analyse")
    return texts, pairs, f"{name}, {len(texts)} texts"


def with_seconds(stats) -> dict:
    """``stats.to_dict()`` plus ``importance`` (the kinds computed) and ``seconds`` (what each pass — observe,
    gradient, ablation — cost here)."""
    doc = stats.to_dict()
    kinds = [m.removeprefix("importance_") for m in doc["heads"] if m.startswith("importance_")]
    return doc | {"importance": kinds, "seconds": {k: round(v, 3) for k, v in stats.seconds.items()}}


def run(args: argparse.Namespace) -> int:
    from ..analysis import AnalysisConfig, analyze
    from ..io import atomic_dir, check_writable_dir
    from ..report import write_report

    if args.task == "translation":
        return run_seq2seq(args)
    if args.importance_examples is not None and args.task in ("stsb", "lm"):
        raise HeadwiseError(f"--importance-examples applies to classification and translation; analyze --task "
                            f"{args.task} takes the gradient of the analysed texts (their number: --limit)")
    examples = args.importance_examples or IMPORTANCE_EXAMPLES
    chosen = args.importance or "gradient"
    importance = () if chosen == "none" else tuple(k for k in chosen.split(",") if k)
    config = AnalysisConfig(batch_size=args.batch_size, max_length=args.max_length, examples=args.examples,
                            example_tokens=args.example_tokens, importance=importance,
                            ablation_texts=args.ablation_texts,
                            recompute=ACTIVATIONS[args.activations],
                            model_name=args.model or "all-MiniLM-L6-v2 (packaged)")
    check_writable_dir(args.out, args.force)  # before any slow work
    if args.task == "stsb":
        texts, pairs, data_name = _texts(args)
        config.data_name = data_name
        model, tokenizer = load_task_model(args, None, need_tokenizer=True)
        stats = with_seconds(analyze(model, tokenizer, texts, config, pairs=pairs))
    else:
        task = task_from_args(args, skip=("limit", "batch_size"))
        texts = [t for t in task.texts("calibration") if t.strip()][: args.limit]
        config.data_name = f"{task.name} task, {len(texts)} texts"
        model, tokenizer = load_for_task(args, task)
        # the task's training batch size bounds the backward pass's memory (lm: 4 windows, not --batch-size 32);
        # lm: the gradient of the analysed texts' own next-token loss, from the statistics pass itself (one forward
        # and one backward per batch of 4 texts); other tasks: of the task loss on --importance-examples examples
        backward_batch = min(args.batch_size, task.train_defaults["batch_size"])
        if "gradient" in importance and args.task == "lm":
            config.batch_size = backward_batch
        inputs = task.batches(tokenizer, "train", backward_batch, examples) \
            if "gradient" in importance and args.task != "lm" else None
        stats = with_seconds(analyze(model, tokenizer, texts, config, loss_fn=task.loss, loss_inputs=inputs))
        if "gradient" in importance:
            stats["importance_data"] = (
                "the analysed texts' next-token loss, in the statistics pass" if inputs is None
                else f"the task loss of {sum(len(b['input_ids']) for b in inputs)} {task.name} training examples")
    stats["task"] = args.task
    # what the report's suggested `headwise plan` carries; a .txt of texts has no scores to plan on (STS-B dev then)
    texts_only = args.task == "stsb" and args.data and Path(args.data).suffix == ".txt"
    stats["run_options"] = run_options(argparse.Namespace(**{**vars(args), "data": None}) if texts_only else args)
    with atomic_dir(args.out, overwrite=args.force) as tmp:
        write_json(tmp / "stats.json", stats)
        write_report(stats, tmp)
    if args.json:
        print_json(stats)
    else:
        cost = ", ".join(f"{k} {v:.1f} s" for k, v in stats["seconds"].items())
        print(f"analysed {stats['sentences']} texts ({stats['tokens']} tokens) with {model.config.model_type}, "
              f"importance: {', '.join(stats['importance']) or 'none'} ({cost}"
              f"{'; gradient of ' + stats['importance_data'] if 'importance_data' in stats else ''}): "
              f"{args.out}/report.html, {args.out}/stats.json")
    return 0


def run_seq2seq(args: argparse.Namespace) -> int:
    """``analyze --task translation``: roles, confidence and gradient importance of every head of every kind
    (``headwise.analysis.analyze_seq2seq``), over teacher-forced pairs of the calibration split."""
    from ..analysis import analyze_seq2seq
    from ..io import atomic_dir, check_writable_dir
    from ..report.seq2seq import seq2seq_report

    importance = {k for k in (args.importance or "gradient").split(",") if k} - {"none"}
    if importance - {"gradient"}:
        raise HeadwiseError(f"--importance {args.importance}: translation supports gradient (of the label loss) or "
                            "none; ablation scores an embedding and has no encoder-decoder form")
    check_writable_dir(args.out, args.force)
    task = task_from_args(args, skip=("limit", "batch_size"))
    model, tokenizer = load_for_task(args, task)
    batches = task.calibration_inputs(tokenizer, limit=args.limit, batch_size=args.batch_size)
    examples = args.importance_examples or IMPORTANCE_EXAMPLES
    loss_inputs = task.batches(tokenizer, "train", args.batch_size, examples) if importance else None
    stats = analyze_seq2seq(model, batches, loss_fn=task.loss if importance else None, loss_inputs=loss_inputs)
    result = stats.to_dict() | {"model": args.model, "data": f"{task.name} task, {task.calibration_split} split, "
                                f"{sum(len(b['input_ids']) for b in batches)} pairs (teacher forcing)"}
    with atomic_dir(args.out, overwrite=args.force) as tmp:
        write_json(tmp / "stats.json", result)
        seq2seq_report(result).write(tmp)
    if args.json:
        print_json(result)
    else:
        counts = ", ".join(f"{kind} {role} {len(heads)}" for kind, roles in result["by_kind"].items()
                           for role, heads in roles.items()) or "no head passes a role threshold"
        print(f"analysed {len(result['heads'])} heads of {model.config.model_type} ({counts}): "
              f"{args.out}/report.html, {args.out}/stats.json")
    return 0
