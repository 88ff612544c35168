"""``headwise convert gqa|latent``: shrink a decoder's key/value cache, optionally uptrain, save, report (the run:
``headwise.workflows.convert``).

Writes ``OUT/model`` (plain transformers when the result allows it, else ``headwise.save_pretrained``) and
``OUT/conversion.json`` (opens with the verdict). Text files give calibration, evaluation and uptraining tokens
(one file is split: the first 90% of its lines calibrate and uptrain, the last 10% evaluate); without ``--data``
the task's default data calibrates (``lm``: shared/data/wikitext-2/valid.txt; ``translation``: the calibration
split of shared/data/multi30k).

The model is loaded like every verb loads it (``headwise.load_model`` with the task's head), so a headwise
checkpoint comes back with its edits. Uptraining keeps its checkpoints in ``OUT.checkpoints``: only the last
complete one (older ones are rotated away), ``--resume`` continues from the last complete one (one a kill left
half-written is removed first) and refuses options that shape the result other than those the run started with
(``OUT.checkpoints/options.json``), and the folder is removed at the end unless ``--keep-checkpoints``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from ..errors import HeadwiseError
from . import model_args
from .options import add, alias, config_options, output_args, runs_methods
from .output import print_json, write_json


# what each page of this verb shows under "examples:" (tests/test_cli_help.py parses every line)
EXAMPLES: dict[str, tuple[str, ...]] = {
    "convert": ("headwise convert gqa --model smollm2-135m --kv-heads 1 --out smol-gqa",
                "headwise convert latent --model smollm2-135m --kv-budget 0.5 --out smol-latent"),
    "convert gqa": ("headwise convert gqa --model smollm2-135m --kv-heads 1 --out smol-gqa",
                    "headwise convert gqa --model smollm2-135m --kv-heads 3 --gqa-init svd --out smol-gqa3"
                    "   # no data",
                    "headwise convert gqa --model smollm2-135m --kv-heads 1 --data my.txt --uptrain-tokens 65536 "
                    "--out smol-gqa-up"),
    "convert latent": ("headwise convert latent --model smollm2-135m --kv-budget 0.5 --out smol-latent",
                       "headwise convert latent --model smollm2-135m --rank 128 --latent-init svd --out smol-r128"
                       "   # no data",
                       "headwise convert latent --model smollm2-135m --kv-budget 0.25 --data my.txt --out smol-l25"),
}


def register(verbs, parents) -> None:
    p = verbs.add_parser("convert", parents=parents, help="shrink the KV cache: grouped-query or latent keys/values")
    p.later(lambda parser: runs_methods(parser, "headwise.conversion"))
    kinds = p.add_subparsers(dest="conversion", required=True, metavar="KIND")
    for name, summary in (("gqa", "merge key/value heads into --kv-heads shared ones"),
                          ("latent", "low-rank latent keys/values at a KV-byte budget")):
        sub = kinds.add_parser(name, parents=parents, help=summary, description=f"{summary}\n\n" + DATA)
        sub.later(lambda parser, name=name: _method_options(parser, name))
        model_args(sub, default="smollm2-135m", dtype="float32")
        add(sub, "--task", default=None, shown="the model's own: lm (decoders) or translation (encoder-decoders)")
        add(sub, "--data", default=None, shown="lm: shared/data/wikitext-2/valid.txt")
        alias(sub, "--text", "--data", "data")
        sub.add_argument("--calib-tokens", type=int, default=16384, help="calibration tokens (default: 16384)")
        sub.add_argument("--eval-tokens", type=int, default=4096, help="evaluation tokens, 0 to skip (default: 4096)")
        add(sub, "--max-length", default=1024)
        sub.add_argument("--uptrain-tokens", type=int, default=0, help="tokens of next-token uptraining (default: 0)")
        sub.add_argument("--distill", type=float, default=0.0, help="weight W of the KL to the original model's "
                         "predictions: (loss + W·KL) / (1 + W), headwise.recover with alpha W / (1 + W)")
        add(sub, "--lr", default=1e-4)
        add(sub, "--resume")
        sub.add_argument("--keep-checkpoints", action="store_true", help="keep OUT.checkpoints after uptraining "
                         "(default: removed once the model is saved)")
        output_args(sub, None, "model/ and conversion.json")
        sub.set_defaults(run=run)


DATA = """--data, a .txt file: the first 90% of its lines calibrate and uptrain, the last 10% evaluate;
--resume continues uptraining from the last complete checkpoint in OUT.checkpoints."""


# the conversion's config and the fields the verb takes
CONFIGS = {"gqa": ("GQAConfig", ("kv_heads", "grouping", "init")),
           "latent": ("LatentConfig", ("kv_budget", "rank", "rope_pairs", "init"))}


def _method_options(parser: argparse.ArgumentParser, name: str) -> None:
    """The fields of the conversion's config (``GQAConfig`` or ``LatentConfig``) the verb takes."""
    from ..conversion import config as configs

    config, fields = CONFIGS[name]
    config_options(parser.add_argument_group(f"the conversion ({config})"), getattr(configs, config), fields,
                   keep_defaults=True)


def checkpoint_dir(out: str) -> Path:
    """Where uptraining keeps its checkpoints: ``OUT.checkpoints`` beside ``OUT``."""
    path = Path(out)
    return path.with_name(f"{path.name}.checkpoints")


# what shapes an uptrained conversion (a resume must match them) and what only changes the report or the speed
SHAPING = ("model", "task", "conversion", "dtype", "data", "calib_tokens", "max_length", "uptrain_tokens", "distill",
           "lr", "kv_heads", "grouping", "init", "kv_budget", "rank", "rope_pairs")
HARMLESS = ("eval_tokens", "device")
OPTIONS = "options.json"  # in OUT.checkpoints: the options uptraining started with


def run_options(args: argparse.Namespace, names: tuple[str, ...]) -> dict:
    return {name: getattr(args, name) for name in names if hasattr(args, name)}


def record_options(args: argparse.Namespace) -> None:
    """Write the options uptraining starts with into ``OUT.checkpoints`` (what ``--resume`` compares)."""
    from ..io import atomic_write_text, json_text

    folder = checkpoint_dir(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / OPTIONS, json_text(run_options(args, SHAPING + HARMLESS), str(folder / OPTIONS)))


def check_resume_options(args: argparse.Namespace) -> None:
    """Refuse ``--resume`` with another option that shapes the result (listing each), say which harmless ones
    take their new value; a run started before options were recorded is resumed with a note."""
    from ..io import read_text
    from ..training.resume import differences, refuse_changed

    path = checkpoint_dir(args.out) / OPTIONS
    if not path.parent.is_dir():
        raise HeadwiseError(f"--resume: no checkpoint in {path.parent}; run without --resume first")
    if not path.is_file():
        print(f"headwise: note: {path.parent} records no options (an older run), so --resume cannot check that "
              "they match", file=sys.stderr)
        return
    try:
        recorded = json.loads(read_text(path))
    except ValueError:
        recorded = None
    if not isinstance(recorded, dict):
        raise HeadwiseError(f"{path} is damaged (not a JSON object); start again without --resume")
    refuse_changed({k: recorded.get(k) for k in SHAPING if k in recorded or hasattr(args, k)},
                   run_options(args, SHAPING), f"the uptraining in {path.parent}")
    for change in differences({k: recorded.get(k) for k in HARMLESS}, run_options(args, HARMLESS)):
        print(f"headwise: note: --resume takes the new {change} (it changes no weight)", file=sys.stderr)


def _task_name(args: argparse.Namespace) -> str:
    """``--task``, checked (conversion shrinks a decoder's cache: lm or translation), else the model's own."""
    from ..models import native_task
    from ..workflows.convert import CONVERTIBLE_TASKS

    if args.task is not None:
        if args.task not in CONVERTIBLE_TASKS:
            raise HeadwiseError(f"--task {args.task}: convert shrinks a decoder's key/value cache; use --task lm "
                                "(decoders) or --task translation (encoder-decoders)")
        return args.task
    native = native_task(args.model)
    if native not in CONVERTIBLE_TASKS:
        what = native or "a base model"
        raise HeadwiseError(f"{args.model} is no decoder language model or encoder-decoder ({what}); convert needs "
                            "one (pass --task lm or translation for a model saved without its head)")
    return native


def run(args: argparse.Namespace) -> int:
    from ..io import atomic_dir, check_writable_dir, export_plain, plain_problem, save_pretrained
    from ..models import load_model
    from ..workflows.convert import ConvertSettings, check, convert
    from .task_options import dispatch_of

    check_writable_dir(args.out, args.force)
    task_name = _task_name(args)
    settings = ConvertSettings(_config(args), data=args.data, calib_tokens=args.calib_tokens,
                               eval_tokens=args.eval_tokens, max_length=args.max_length,
                               uptrain_tokens=args.uptrain_tokens, distill=args.distill, lr=args.lr,
                               checkpoints=str(checkpoint_dir(args.out)), resume=args.resume, device=args.device)
    check(task_name, settings)
    if args.resume:
        check_resume_options(args)  # before any work
    model, tokenizer = load_model(args.model, args.device, args.dtype or "float32", task=task_name, **dispatch_of(args))
    if args.uptrain_tokens and not args.resume:
        record_options(args)
    summary = {"verdict": None, "model": args.model, **convert(model, tokenizer, task_name, settings)}
    if summary.get("uptraining") and not args.keep_checkpoints:
        summary["uptraining"]["checkpoints"] = None
    reason = plain_problem(model)
    summary["saved"] = "plain transformers (AutoModelForCausalLM.from_pretrained)" if reason is None else \
        f"headwise.from_pretrained ({reason})"
    with atomic_dir(args.out, overwrite=args.force) as tmp:
        if reason is None:
            export_plain(model, tmp / "model", tokenizer=tokenizer)
        else:
            save_pretrained(model, tmp / "model", tokenizer=tokenizer)
        write_json(tmp / "conversion.json", summary, indent=1)
    if args.uptrain_tokens and not args.keep_checkpoints:
        shutil.rmtree(checkpoint_dir(args.out), ignore_errors=True)
    if args.json:
        print_json(summary)
    else:
        print(f"{summary['verdict']}\nsaved {args.out}/model ({summary['saved']})")
    return 0


def _config(args: argparse.Namespace):
    """The conversion's config from its options (``GQAConfig`` or ``LatentConfig``)."""
    from ..conversion.config import GQAConfig, LatentConfig

    config, fields = CONFIGS[args.conversion]
    return (GQAConfig if config == "GQAConfig" else LatentConfig)(**{name: getattr(args, name) for name in fields})
