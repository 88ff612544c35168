"""``headwise convert gqa|latent``: shrink a decoder's key/value cache, optionally uptrain, save, report.

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
from .options import add, alias, config_options, output_args
from .task_options import model_costs, run_record
from .output import print_json, write_json

CONVERTIBLE_TASKS = ("lm", "translation")


def register(verbs, parents) -> None:
    p = verbs.add_parser("convert", parents=parents, help="shrink the KV cache: grouped-query or latent keys/values")
    kinds = p.add_subparsers(dest="conversion", required=True, metavar="KIND")
    for name, summary in (("gqa", "merge key/value heads into --kv-heads shared ones"),
                          ("latent", "low-rank latent keys/values at a KV-byte budget")):
        sub = kinds.add_parser(name, parents=parents, help=summary, description=f"{summary}\n\n" + DATA)
        sub.later(lambda parser, name=name: _method_options(parser, name))
        model_args(sub, default="smollm2-135m", dispatch=False, dtype="float32")
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


def _method_options(parser: argparse.ArgumentParser, name: str) -> None:
    """The fields of the conversion's config (``GQAConfig`` or ``LatentConfig``) the verb takes."""
    from ..conversion.config import GQAConfig, LatentConfig

    config, fields = {"gqa": (GQAConfig, ("kv_heads", "grouping", "init")),
                      "latent": (LatentConfig, ("kv_budget", "rank", "rope_pairs", "init"))}[name]
    config_options(parser.add_argument_group(f"the conversion ({config.__name__})"), config, fields,
                   keep_defaults=True)


def _windows(ids, tokens: int, window: int, what: str) -> list:
    """``[1, window]`` slices of the first ``tokens`` ids; refuses when not even one fits."""
    ids = ids[:tokens]
    if len(ids) < window:
        raise HeadwiseError(f"{what}: {len(ids)} tokens, fewer than one --max-length of {window}; pass more text, "
                            "more tokens or a shorter --max-length")
    return [ids[i : i + window][None] for i in range(0, len(ids) - window + 1, window)]


def _text_task(path: str, window: int, tokens: int | None = None):
    """The ``lm`` task on ``--data``: its split policy (first 90% of lines calibrate and uptrain, the last 10%
    evaluate), its token stream and, for uptraining, its disjoint windows of ``window`` tokens."""
    from ..tasks import LanguageModeling

    from ..io import read_text

    file = Path(path)
    if not file.is_file():
        raise HeadwiseError(f"--data {path}: no such file (plain text, one paragraph a line)")
    lines = read_text(file).splitlines()
    if len(lines) < 10:
        raise HeadwiseError(f"--data {path} has {len(lines)} lines; it needs at least 10 (90%/10% split)")
    return LanguageModeling(data=path, max_length=window, max_tokens=tokens)


def _uptrain(model, teacher, tokenizer, task, windows: list, args: argparse.Namespace) -> dict:
    """Train every weight on ``windows`` through ``headwise.recover`` on the ``lm`` task: the next-token loss, or
    with a teacher ``(1 − α)·loss + α·KL(teacher ‖ student)`` at temperature 1, ``α = W / (1 + W)`` for
    ``--distill W`` (the loss ``loss + W·KL`` divided by ``1 + W``)."""
    from transformers import TrainerCallback

    from ..tasks import recover

    class Result(TrainerCallback):
        def on_train_end(self, train_args, state, control, **kwargs):
            self.steps = state.global_step
            self.loss = next((h["train_loss"] for h in reversed(state.log_history) if "train_loss" in h), None)

    result, n = Result(), len(windows)
    checkpoints = checkpoint_dir(args.out)
    if args.resume:
        drop_incomplete_checkpoints(checkpoints)
    recover(model, tokenizer, task, teacher=teacher, mode="finetune" if teacher is None else "distill", epochs=1,
            alpha=args.distill / (1 + args.distill), temperature=1.0, batch_size=1, learning_rate=args.lr, seed=0,
            output_dir=str(checkpoints), resume=args.resume, lr_scheduler_type="cosine",
            warmup_steps=max(1, n // 20), logging_steps=max(1, n // 10), save_steps=max(1, n // 4),
            save_total_limit=1, use_cpu=args.device == "cpu", callbacks=[result])
    return {"tokens": sum(w.numel() for w in windows), "steps": result.steps, "loss": result.loss,
            "distill": args.distill, "alpha": args.distill / (1 + args.distill), "learning_rate": args.lr,
            "checkpoints": str(checkpoints) if args.keep_checkpoints else None}


def _uptrain_task(args: argparse.Namespace, calib_ids) -> tuple:
    """``(task, windows)``: the ``lm`` task whose training windows uptraining runs on (the first
    ``--uptrain-tokens`` of ``--data``), and those windows."""
    windows = _windows(calib_ids, args.uptrain_tokens, args.max_length, "--uptrain-tokens")
    return _text_task(args.data, args.max_length, tokens=len(windows) * args.max_length), windows


def checkpoint_dir(out: str) -> Path:
    """Where uptraining keeps its checkpoints: ``OUT.checkpoints`` beside ``OUT``."""
    path = Path(out)
    return path.with_name(f"{path.name}.checkpoints")


def complete(checkpoint: Path) -> bool:
    """Whether a Trainer checkpoint was saved whole: its ``trainer_state.json``, written last, parses."""
    try:
        json.loads((checkpoint / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return False
    return True


def drop_incomplete_checkpoints(folder: Path) -> None:
    """Remove the ``checkpoint-N`` folders a kill left half-written, so that resuming starts from the last
    complete one; refuses when none is complete."""
    found = sorted(folder.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1])
                   if p.name.split("-")[-1].isdigit() else -1)
    for checkpoint in [c for c in found if not complete(c)]:
        print(f"headwise: note: {checkpoint} is incomplete (the run was stopped while saving it); resuming from "
              "the checkpoint before it", file=sys.stderr)
        shutil.rmtree(checkpoint)
    if not any(complete(c) for c in found if c.exists()):
        raise HeadwiseError(f"--resume: no checkpoint in {folder} is complete; run without --resume")


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


def _verdict(summary: dict) -> str:
    before, after = summary["kv_bytes_per_token"]["before"], summary["kv_bytes_per_token"]["after"]
    text = f"KV cache {before:,} → {after:,} bytes/token in 16-bit ({after / before - 1:+.0%})"
    ppl = summary.get("perplexity")
    if ppl:
        last = ppl.get("uptrained", ppl["converted"])
        text += f"; perplexity {ppl['original']:.2f} → {last:.2f} (×{last / ppl['original']:.2f})"
    return text


def _task_name(args: argparse.Namespace) -> str:
    """``--task``, checked (conversion shrinks a decoder's cache: lm or translation), else the model's own."""
    from ..models import native_task

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


def _default_calibration(task_name: str, tokenizer, args: argparse.Namespace):
    """Calibration batches from the task's default data when no ``--data`` is given, or one line saying how to
    pass data."""
    from ..tasks import LanguageModeling, Translation

    try:
        if task_name == "lm":
            return LanguageModeling(max_length=args.max_length).source(), None
        batches = Translation(max_length=args.max_length).calibration_inputs(tokenizer, limit=256, batch_size=16,
                                                                         device=args.device)
        return None, batches
    except HeadwiseError as err:
        fix = "pass --data FILE (calibration text)" if task_name == "lm" else "calibrate from Python with " \
            "model-input dicts (headwise.convert_gqa(..., calibration=batches))"
        flag = f"--{args.conversion}-init"
        raise HeadwiseError(f"{flag} calibrated needs calibration data and the default is not here ({err}); "
                            f"{fix}, or pass {flag} svd (weights only, no data)") from None


def run(args: argparse.Namespace) -> int:
    from ..conversion import convert_gqa, convert_latent, kv_cache_bytes
    from ..io import export_plain, plain_problem
    from ..io import atomic_dir, check_writable_dir, save_pretrained
    from ..models import load_model

    check_writable_dir(args.out, args.force)
    task_name = _task_name(args)
    if task_name == "translation" and args.data:
        raise HeadwiseError("for encoder-decoders the CLI calibrates on the translation task's data, not --data; "
                            "calibrate from Python with model-input dicts (headwise.convert_gqa(..., "
                            "calibration=batches))")
    if args.uptrain_tokens and (task_name != "lm" or not args.data):
        raise HeadwiseError("--uptrain-tokens needs a decoder and --data FILE (training text)")
    if args.resume and not args.uptrain_tokens:
        raise HeadwiseError("--resume continues uptraining; give --uptrain-tokens too")
    if args.resume:
        check_resume_options(args)  # before any work
    text = _text_task(args.data, args.max_length) if args.data else None  # bad text fails before the model loads
    model, tokenizer = load_model(args.model, args.device, args.dtype or "float32", task=task_name)
    calib_batches = None
    if args.init == "calibrated" and not args.data:
        args.data, calib_batches = _default_calibration(task_name, tokenizer, args)
        if args.data:
            print(f"headwise: calibrating on {args.data} (no --data given)", file=sys.stderr)
            text = _text_task(args.data, args.max_length)
    calibration = evaluation = None
    if text is not None:
        calib_ids = text.token_stream(tokenizer, "train")
        calibration = _windows(calib_ids, args.calib_tokens, args.max_length, "calibration (first 90% of --data)")
        if args.eval_tokens > 0:  # the lm task's perplexity on the last 10% of --data, its first --eval-tokens
            evaluation = _text_task(args.data, args.max_length, tokens=args.eval_tokens)
            _windows(evaluation.token_stream(tokenizer, "eval"), args.eval_tokens, args.max_length,
                     "evaluation (last 10% of --data)")  # at least one window
    calibration = calib_batches if calib_batches is not None else calibration
    teacher = None
    uptraining = _uptrain_task(args, calib_ids) if args.uptrain_tokens else None
    if uptraining and args.distill > 0:  # the outputs of the model before the edit, not a second model
        from ..tasks import CachedTeacher

        teacher = CachedTeacher.record(model, tokenizer, uptraining[0])
    summary: dict = {"verdict": None, "model": args.model, "task": task_name, "conversion": args.conversion,
                     "kv_bytes_per_token": {"before": kv_cache_bytes(model)}}
    def perplexity() -> float:
        return evaluation.evaluate(model, tokenizer)["perplexity"]

    ppl = {"original": perplexity()} if evaluation else None
    costs = model_costs(model)
    cal = calibration if args.init == "calibrated" else None
    if args.conversion == "gqa":
        convert_gqa(model, kv_heads=args.kv_heads, grouping=args.grouping, init=args.init, calibration=cal)
        summary["options"] = {"kv_heads": args.kv_heads, "grouping": args.grouping, "init": args.init}
    else:
        convert_latent(model, kv_budget=args.kv_budget, rank=args.rank, rope_pairs=args.rope_pairs, init=args.init,
                       calibration=cal)
        summary["options"] = {"kv_budget": args.kv_budget, "rank": args.rank, "rope_pairs": args.rope_pairs,
                              "init": args.init}
    summary["kv_bytes_per_token"]["after"] = kv_cache_bytes(model)
    if ppl is not None:
        ppl["converted"] = perplexity()
    if args.uptrain_tokens:
        if not args.resume:
            record_options(args)
        summary["uptraining"] = _uptrain(model, teacher, tokenizer, *uptraining, args)
        if ppl is not None:
            ppl["uptrained"] = perplexity()
    summary["perplexity"] = ppl
    measured = ppl or {}
    summary.update(run_record(text if ppl else None, measured.get("original"), measured.get("converted"),
                              measured.get("uptrained"), costs, model))
    reason = plain_problem(model)
    summary["saved"] = "plain transformers (AutoModelForCausalLM.from_pretrained)" if reason is None else \
        f"headwise.from_pretrained ({reason})"
    summary["verdict"] = _verdict(summary)
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
