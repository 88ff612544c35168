"""Recovery after an edit, as the editing workflows run it: the teacher is chosen before the edit, recovery runs
after it, and the workflow records what ran. After a reversible edit (ops attached) the teacher is the model itself
with its ops switched off (no copy); after one that rewrites weights it is a copy taken before the edit, or on the
``lm`` task the unedited model's recorded outputs."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from torch import nn

from ..errors import HeadwiseError
from ..tasks import CachedTeacher, Task
from ..tasks.recovery import OFF, check_recovery, recover

COPY, CACHED = "copy", "cached"  # teacher choices that name no model (OFF: the student with its ops off)


@dataclass(frozen=True)
class Recovery:
    """How an edited model recovers (``headwise.recover``): ``mode`` (``none``, ``finetune``, ``distill``),
    ``epochs``, ``steps`` (-1: no limit), the distillation's ``alpha``, ``temperature`` and ``distance``,
    ``memory`` (``headwise.trainer.memory``) and ``teacher``: None (the default for the edit), ``"off"``,
    ``"copy"``, ``"cached"`` or a model name or folder. Checked when made."""

    mode: str = "none"
    epochs: float = 1.0
    steps: int = -1
    alpha: float = 0.5
    temperature: float = 2.0
    distance: str = "mse"
    memory: str = "keep"
    teacher: str | None = None

    def __post_init__(self) -> None:
        if self.teacher and self.mode != "distill":
            raise HeadwiseError("a teacher applies to distillation (mode 'distill')")
        check_recovery(self.mode, self.epochs, self.steps, self.alpha, self.temperature, self.distance)

    def teacher_for(self, model: nn.Module, tokenizer: Any, task: Task, *, reversible: bool = False,
                    device: str = "cpu", dtype: str | None = None) -> Any:
        """The distillation teacher, taken before the edit: ``"off"`` (default after a ``reversible`` edit), the
        unedited model's recorded outputs (``"cached"``; default otherwise on ``lm``), a copy (``"copy"``;
        default otherwise) or the named model (loaded on ``device``/``dtype``); None without distillation."""
        if self.mode != "distill":
            return None
        choice = self.teacher or (OFF if reversible else CACHED if task.name == "lm" else COPY)
        if choice == CACHED:  # with steps, only the windows those steps can reach are recorded (and trained on)
            return CachedTeacher.record(model, tokenizer, task, max_steps=self.steps)
        if choice == OFF:
            if not reversible:
                raise HeadwiseError("teacher 'off' needs a reversible edit (ops attached); this edit rewrites "
                                    "weights: use teacher 'copy' or a model name")
            return OFF
        if choice == COPY:
            return copy.deepcopy(model)
        from ..models import load_model

        return load_model(choice, device, dtype, with_tokenizer=False, task=task)[0]

    def run(self, model: nn.Module, tokenizer: Any, task: Task, teacher: Any) -> dict[str, Any]:
        """Recover the edited ``model`` with ``teacher`` (``teacher_for``); returns what ran (for the summary)."""
        if self.mode == "none":
            return {"mode": self.mode}
        cached = isinstance(teacher, CachedTeacher)
        recover(model, tokenizer, task, teacher=teacher, mode=self.mode, epochs=self.epochs, max_steps=self.steps,
                alpha=self.alpha, temperature=self.temperature, distance=self.distance,
                limit=teacher.limit if cached else None, memory=self.memory)
        done = {"mode": self.mode, "epochs": self.epochs, "steps": self.steps, "train_memory": self.memory}
        if self.mode == "distill":
            named = self.teacher not in (None, OFF, COPY, CACHED)
            done |= {"teacher": self.teacher if named else "the model with its headwise ops switched off"
                     if isinstance(teacher, str) else "the outputs of the model before the edit (cached)"
                     if cached else "a copy of the model before the edit",
                     "alpha": self.alpha, "temperature": self.temperature, "distance": self.distance}
        return done
