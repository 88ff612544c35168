"""Recovery after an edit: a short fine-tune of the edited model on its task, with distillation from the
unedited model (``mode="distill"``), the task loss only (``"finetune"``) or nothing (``"none"``).

Distillation: ``loss = (1 − α) · task loss + α · distillation loss`` per batch, the teacher (frozen, eval mode,
``no_grad``) run on the same batch; logits are distilled by temperature-softened KL, embeddings by a distance
(``tasks.distillation``). Training goes through the task's ``train_objective`` (``HeadwiseTrainer``), so it runs
unchanged under ``torchrun``.

    teacher = copy.deepcopy(model)          # before the edit
    headwise.prune_heads(model, ...)         # any edit
    headwise.recover(model, tokenizer, "stsb", teacher=teacher, epochs=1)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..errors import HeadwiseError
from .base import Task
from .distillation import DISTANCES, distillation_loss

MODES = ("distill", "finetune", "none")


class DistillationObjective(nn.Module):
    """``forward(**batch) -> {"loss", "task_loss", "distill_loss"}``: the student's task loss blended with its
    distillation loss toward ``teacher`` (kept out of the module tree: never trained, saved or wrapped by DDP;
    moved to the batch's device on first use)."""

    def __init__(self, task: Task, model: nn.Module, teacher: nn.Module, *, alpha: float = 0.5,
                 temperature: float = 2.0, distance: str = "mse") -> None:
        super().__init__()
        self.task, self.model = task, model
        self._teacher = [teacher.eval()]
        self.alpha, self.temperature, self.distance = alpha, temperature, distance

    @property
    def teacher(self) -> nn.Module:
        return self._teacher[0]

    def forward(self, **batch: torch.Tensor) -> dict[str, torch.Tensor]:
        student = self.task.outputs(self.model, batch)
        device = student.values.device
        if next(self.teacher.parameters()).device != device:
            self._teacher[0] = self.teacher.to(device)
        with torch.no_grad():
            target = self.task.outputs(self.teacher, batch)
        task_loss = self.task.loss_from(student, batch).mean()
        distill = distillation_loss(student, target, temperature=self.temperature, distance=self.distance).mean()
        return {"loss": (1 - self.alpha) * task_loss + self.alpha * distill, "task_loss": task_loss.detach(),
                "distill_loss": distill.detach()}


def recover(model: nn.Module, tokenizer: Any, task: Task | str, *, teacher: nn.Module | None = None,
            mode: str = "distill", epochs: float = 1.0, max_steps: int = -1, alpha: float = 0.5,
            temperature: float = 2.0, distance: str = "mse", limit: int | None = None, seed: int = 0,
            progress: bool = True, **train_args: Any) -> nn.Module:
    """Recover ``model`` (in place) after an edit; returns it in eval mode.

    ``mode``: ``"distill"`` (task loss + distillation from ``teacher``, the unedited model), ``"finetune"`` (the
    task's own fine-tuning recipe) or ``"none"`` (the model untouched). ``alpha``: weight of the distillation loss
    (0–1); ``temperature``: softening of logits; ``distance``: ``"mse"`` or ``"cosine"`` for embedding tasks
    (STS-B, regression). ``limit``: train examples; ``train_args``: batch_size, learning_rate, penalties,
    output_dir and resume (checkpoints), ... (``Task.train_objective``)."""
    from . import get_task

    task = get_task(task)
    check_recovery(mode, epochs, max_steps, alpha, temperature, distance)
    if mode == "none":
        return model.eval()
    if mode == "finetune":
        return task.finetune(model, tokenizer, epochs=epochs, max_steps=max_steps, limit=limit, seed=seed,
                             progress=progress, **train_args)
    if teacher is None:
        raise HeadwiseError("mode 'distill' needs teacher= (the unedited model, e.g. copy.deepcopy(model) taken "
                            "before the edit); or use mode='finetune'")
    if teacher is model:
        raise HeadwiseError("the teacher is the student itself; pass a copy of the model taken before the edit")
    task.check_model(teacher, tokenizer)
    objective = DistillationObjective(task, model, teacher, alpha=alpha, temperature=temperature, distance=distance)
    task.train_objective(objective, tokenizer, epochs=epochs, max_steps=max_steps, limit=limit, seed=seed,
                         progress=progress, **train_args)
    return model.eval()


def check_recovery(mode: str, epochs: float, max_steps: int = -1, alpha: float = 0.5, temperature: float = 2.0,
                   distance: str = "mse") -> None:
    """Raise ``HeadwiseError`` on a bad recovery setting (before any model work)."""
    if mode not in MODES:
        raise HeadwiseError(f"recovery mode {mode!r} is not one of {', '.join(MODES)}")
    if mode != "none" and epochs <= 0 and (max_steps is None or max_steps <= 0):
        raise HeadwiseError(f"recovery epochs {epochs} must be > 0 (or give max_steps); use mode 'none' to skip it")
    if not 0 <= alpha <= 1:
        raise HeadwiseError(f"alpha {alpha} must be between 0 (task loss only) and 1 (distillation only)")
    if temperature <= 0:
        raise HeadwiseError(f"temperature {temperature} must be > 0 (2 is usual)")
    if distance not in DISTANCES:
        raise HeadwiseError(f"distance {distance!r} is not one of {', '.join(DISTANCES)}")
