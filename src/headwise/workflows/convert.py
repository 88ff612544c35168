"""Key/value-cache conversion as one function (``headwise convert gqa|latent``): calibrate on a text (or the task's
default data), convert, evaluate perplexity before and after, and optionally uptrain with next-token loss and
distillation from the unedited model's recorded outputs.

>>> summary = convert(model, tokenizer, "lm", ConvertSettings(GQAConfig(kv_heads=1), data="my.txt"))
>>> summary["verdict"]                                  # KV cache 9,216 → 1,536 bytes/token ...

Uptraining keeps its Trainer checkpoints in ``checkpoints`` (only the last complete one); ``resume`` continues from
it, a half-written one removed first. Nothing else is written: the caller saves the model.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from ..conversion import convert_gqa, convert_latent, kv_cache_bytes
from ..conversion.config import GQAConfig, LatentConfig
from ..errors import HeadwiseError
from ..tasks import LanguageModeling, Translation
from ..training import CachedTeacher, recover
from .record import model_costs, run_record

CONVERTIBLE_TASKS = ("lm", "translation")


@dataclass
class ConvertSettings:
    """What ``convert`` does: the conversion ``config`` (``GQAConfig`` or ``LatentConfig``); ``data``, a text file
    (its first 90% of lines calibrate and uptrain, its last 10% evaluate; None: the task's default data
    calibrates and nothing is evaluated); ``calib_tokens`` and ``eval_tokens`` (0: no evaluation) in windows of
    ``max_length``; ``uptrain_tokens`` of uptraining (0: none) at learning rate ``lr``, with ``distill`` the weight
    W of the KL to the unedited model, its checkpoints in ``checkpoints``, ``resume``-able; ``device`` of the
    calibration batches and the Trainer."""

    config: GQAConfig | LatentConfig
    data: str | None = None
    calib_tokens: int = 16384
    eval_tokens: int = 4096
    max_length: int = 1024
    uptrain_tokens: int = 0
    distill: float = 0.0
    lr: float = 1e-4
    checkpoints: str | None = None
    resume: bool = False
    device: str = "cpu"

    @property
    def conversion(self) -> str:
        return "gqa" if isinstance(self.config, GQAConfig) else "latent"


def windows(ids, tokens: int, window: int, what: str) -> list:
    """``[1, window]`` slices of the first ``tokens`` ids; refuses when not even one fits."""
    ids = ids[:tokens]
    if len(ids) < window:
        raise HeadwiseError(f"{what}: {len(ids)} tokens, fewer than one --max-length of {window}; pass more text, "
                            "more tokens or a shorter --max-length")
    return [ids[i : i + window][None] for i in range(0, len(ids) - window + 1, window)]


def text_task(path: str, window: int, tokens: int | None = None):
    """The ``lm`` task on ``--data``: its split policy (first 90% of lines calibrate and uptrain, the last 10%
    evaluate), its token stream and, for uptraining, its disjoint windows of ``window`` tokens."""
    from ..io import read_text

    file = Path(path)
    if not file.is_file():
        raise HeadwiseError(f"--data {path}: no such file (plain text, one paragraph a line)")
    lines = read_text(file).splitlines()
    if len(lines) < 10:
        raise HeadwiseError(f"--data {path} has {len(lines)} lines; it needs at least 10 (90%/10% split)")
    return LanguageModeling(data=path, max_length=window, max_tokens=tokens)


def uptrain(model: nn.Module, teacher: Any, tokenizer: Any, task: Any, chunks: list,
            settings: ConvertSettings) -> dict[str, Any]:
    """Train every weight on ``chunks`` (windows of token ids) through ``headwise.recover`` on the ``lm`` task:
    the next-token loss, or with a teacher ``(1 − α)·loss + α·KL(teacher ‖ student)`` at temperature 1,
    ``α = W / (1 + W)`` for ``distill`` W (the loss ``loss + W·KL`` divided by ``1 + W``)."""
    from transformers import TrainerCallback

    class Result(TrainerCallback):
        def on_train_end(self, train_args, state, control, **kwargs):
            self.steps = state.global_step
            self.loss = next((h["train_loss"] for h in reversed(state.log_history) if "train_loss" in h), None)

    if settings.checkpoints is None:
        raise HeadwiseError("uptraining keeps checkpoints: give ConvertSettings(checkpoints=FOLDER)")
    result, n, checkpoints = Result(), len(chunks), Path(settings.checkpoints)
    if settings.resume:
        drop_incomplete_checkpoints(checkpoints)
    alpha = settings.distill / (1 + settings.distill)
    recover(model, tokenizer, task, teacher=teacher, mode="finetune" if teacher is None else "distill", epochs=1,
            alpha=alpha, temperature=1.0, batch_size=1, learning_rate=settings.lr, seed=0,
            output_dir=str(checkpoints), resume=settings.resume, lr_scheduler_type="cosine",
            warmup_steps=max(1, n // 20), logging_steps=max(1, n // 10), save_steps=max(1, n // 4),
            save_total_limit=1, use_cpu=settings.device == "cpu", callbacks=[result])
    return {"tokens": sum(w.numel() for w in chunks), "steps": result.steps, "loss": result.loss,
            "distill": settings.distill, "alpha": alpha, "learning_rate": settings.lr, "checkpoints": str(checkpoints)}


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


def verdict(summary: dict) -> str:
    before, after = summary["kv_bytes_per_token"]["before"], summary["kv_bytes_per_token"]["after"]
    text = f"KV cache {before:,} → {after:,} bytes/token in 16-bit ({after / before - 1:+.0%})"
    ppl = summary.get("perplexity")
    if ppl:
        last = ppl.get("uptrained", ppl["converted"])
        text += f"; perplexity {ppl['original']:.2f} → {last:.2f} (×{last / ppl['original']:.2f})"
    return text


def default_calibration(task_name: str, tokenizer: Any, settings: ConvertSettings) -> tuple[str | None, Any]:
    """``(text file, None)`` for the ``lm`` task's default data, or ``(None, batches)`` of the translation task's
    calibration split, when no ``data`` is given; refused in one line saying how to pass data."""
    try:
        if task_name == "lm":
            return LanguageModeling(max_length=settings.max_length).source(), None
        batches = Translation(max_length=settings.max_length).calibration_inputs(tokenizer, limit=256, batch_size=16,
                                                                             device=settings.device)
        return None, batches
    except HeadwiseError as err:
        fix = "pass --data FILE (calibration text)" if task_name == "lm" else "calibrate from Python with " \
            "model-input dicts (headwise.convert_gqa(..., calibration=batches))"
        flag = f"--{settings.conversion}-init"
        raise HeadwiseError(f"{flag} calibrated needs calibration data and the default is not here ({err}); "
                            f"{fix}, or pass {flag} svd (weights only, no data)") from None


def check(task_name: str, settings: ConvertSettings) -> None:
    """Refuse settings that cannot work together, before any model loads."""
    if task_name not in CONVERTIBLE_TASKS:
        raise HeadwiseError(f"--task {task_name}: convert shrinks a decoder's key/value cache; use --task lm "
                            "(decoders) or --task translation (encoder-decoders)")
    if task_name == "translation" and settings.data:
        raise HeadwiseError("for encoder-decoders the CLI calibrates on the translation task's data, not --data; "
                            "calibrate from Python with model-input dicts (headwise.convert_gqa(..., "
                            "calibration=batches))")
    if settings.uptrain_tokens and (task_name != "lm" or not settings.data):
        raise HeadwiseError("--uptrain-tokens needs a decoder and --data FILE (training text)")
    if settings.resume and not settings.uptrain_tokens:
        raise HeadwiseError("--resume continues uptraining; give --uptrain-tokens too")
    if settings.data:
        text_task(settings.data, settings.max_length)  # bad text fails before the model loads


def convert(model: nn.Module, tokenizer: Any, task_name: str, settings: ConvertSettings) -> dict[str, Any]:
    """Convert ``model`` in place by ``settings`` (see the module docstring) for the ``task_name`` task (``lm`` or
    ``translation``); returns the summary (``verdict`` first: what ``headwise convert`` writes)."""
    check(task_name, settings)
    data, calibration_batches = settings.data, None
    if settings.config.init == "calibrated" and not data:
        data, calibration_batches = default_calibration(task_name, tokenizer, settings)
        if data:
            print(f"headwise: calibrating on {data} (no --data given)", file=sys.stderr)
    calibration = evaluation = uptraining = teacher = None
    if data is not None:
        text = text_task(data, settings.max_length)
        calib_ids = text.token_stream(tokenizer, "train")
        calibration = windows(calib_ids, settings.calib_tokens, settings.max_length,
                              "calibration (first 90% of --data)")
        if settings.eval_tokens > 0:  # the lm task's perplexity on the last 10% of the data
            evaluation = text_task(data, settings.max_length, tokens=settings.eval_tokens)
            windows(evaluation.token_stream(tokenizer, "eval"), settings.eval_tokens, settings.max_length,
                    "evaluation (last 10% of --data)")  # at least one window
        if settings.uptrain_tokens:
            up = windows(calib_ids, settings.uptrain_tokens, settings.max_length, "--uptrain-tokens")
            uptraining = (text_task(data, settings.max_length, tokens=len(up) * settings.max_length), up)
    calibration = calibration_batches if calibration_batches is not None else calibration
    if uptraining and settings.distill > 0:  # the outputs of the model before the edit, not a second model
        teacher = CachedTeacher.record(model, tokenizer, uptraining[0])
    summary: dict[str, Any] = {"verdict": None, "task": task_name, "conversion": settings.conversion,
                               "kv_bytes_per_token": {"before": kv_cache_bytes(model)}}

    def perplexity() -> float:
        return evaluation.evaluate(model, tokenizer)["perplexity"]

    ppl = {"original": perplexity()} if evaluation else None
    costs = model_costs(model)
    given = calibration if settings.config.init == "calibrated" else None
    (convert_gqa if settings.conversion == "gqa" else convert_latent)(model, config=settings.config,
                                                                      calibration=given)
    summary["options"] = {k: v for k, v in vars(settings.config).items() if k not in ("selection", "ridge")}
    summary["kv_bytes_per_token"]["after"] = kv_cache_bytes(model)
    if ppl is not None:
        ppl["converted"] = perplexity()
    if uptraining:
        summary["uptraining"] = uptrain(model, teacher, tokenizer, *uptraining, settings)
        if ppl is not None:
            ppl["uptrained"] = perplexity()
    summary["perplexity"] = ppl
    measured = ppl or {}
    summary.update(run_record(evaluation, measured.get("original"), measured.get("converted"),
                              measured.get("uptrained"), costs, model))
    summary["verdict"] = verdict(summary)
    return summary
