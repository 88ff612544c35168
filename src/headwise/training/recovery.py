"""Recovery after an edit: a short fine-tune of the edited model on its task, with distillation from the
unedited model (``mode="distill"``), the task loss only (``"finetune"``) or nothing (``"none"``).

Distillation: ``loss = (1 − α) · task loss + α · distillation loss`` per batch, the teacher (frozen, eval mode,
``no_grad``) run on the same batch; logits are distilled by temperature-softened KL, embeddings by a distance
(``tasks.distillation``). Training goes through ``train_objective`` (``HeadwiseTrainer``), so it runs
unchanged under ``torchrun``.

The teacher costs no memory when the edit is reversible (gates, masks, L0 gates, mixers, mechanisms,
quantizers: ops attached to the attention modules): ``teacher="off"`` runs the student itself with every headwise
op switched off (``switched_off``). That is the unedited model as long as only the ops' parameters have trained;
when the shared weights train too, it is the current weights without the edit (a teacher that moves with them).
An edit that rewrites weights (head removal, KV merge, collaborative heads) needs the model from before the edit:

    teacher = copy.deepcopy(model)          # before the edit (a second copy of the weights)
    headwise.prune_heads(model, ...)         # any edit
    headwise.recover(model, tokenizer, "stsb", teacher=teacher, epochs=1)

or, for a causal LM, the teacher's outputs on the training windows recorded before the edit (its last hidden
states and a copy of its output head only, not a second model):

    teacher = CachedTeacher.record(model, tokenizer, task)   # before the edit
    headwise.convert_gqa(model, kv_heads=1)
    headwise.recover(model, tokenizer, task, teacher=teacher, epochs=1)

    headwise.apply_mechanism(model, "local", window=64)   # a reversible edit: no copy
    headwise.recover(model, tokenizer, "stsb", teacher="off", epochs=1)

``Recovery`` is recovery as the editing workflows run it: the teacher chosen before the edit (by default the
model with its ops off after a reversible edit, else a copy, or on ``lm`` the recorded outputs), run after it,
and what ran returned for the record.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import nn

from ..errors import HeadwiseError
from ..runtime import eval_mode
from ..runtime.ops import ATTR
from ..sites import find_sites
from ..tasks import Task, TaskOutputs, get_task
from ..tasks.distillation import DISTANCES, distillation_loss
from .finetune import finetune, train_objective

MODES = ("distill", "finetune", "none")
OFF = "off"  # teacher=OFF: the student with its headwise ops switched off
COPY, CACHED = "copy", "cached"  # teacher choices that name no model (OFF: the student with its ops off)


def has_ops(model: nn.Module) -> bool:
    """Whether any attention module of ``model`` carries headwise ops (an edit ``switched_off`` can undo)."""
    return any(getattr(s.module, ATTR, None) is not None for s in find_sites(model))


@contextmanager
def switched_off(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` with every headwise op (gates, masks, mixers, mechanisms, quantizers, observers) switched off and
    in eval mode for the block: the model without its reversible edits. Nothing is copied; each attention
    module's ops are set aside in place (``None`` in their slot) and put back after."""
    held = []
    for site in find_sites(model):
        ops = site.module._modules.get(ATTR)
        if ops is not None:
            held.append((site.module, ops))
            site.module._modules[ATTR] = None
    try:
        with eval_mode(model):
            yield model
    finally:
        for module, ops in held:
            module._modules[ATTR] = ops


class CachedTeacher:
    """A causal LM's outputs on the training windows of a task, recorded before an edit that rewrites weights:
    the last hidden states ``[T, D]`` of every window (keyed by its token ids) and a copy of the output head
    ``[V, D]``; ``outputs(batch)`` rebuilds the logits ``head(hidden)`` the model gave. Costs ``windows × T × D``
    values plus the head instead of a second copy of the model."""

    def __init__(self, hidden: dict[bytes, torch.Tensor], head: nn.Linear, limit: int | None = None) -> None:
        self.hidden, self.head, self.limit = hidden, head, limit  # limit: the training windows recorded

    @classmethod
    @torch.no_grad()
    def record(cls, model: nn.Module, tokenizer: Any, task: Task, limit: int | None = None,
               max_steps: int | None = None, progress: bool = True) -> "CachedTeacher":
        """Run ``model`` once over the ``limit`` first training windows of ``task`` (what ``recover(...,
        limit=teacher.limit)`` trains on); ``max_steps`` (> 0): only the windows that many updates of the
        task's default batch size reach."""
        from ..progress import progress_bar

        if max_steps is not None and max_steps > 0:
            limit = min(limit or max_steps * task.train_defaults["batch_size"],
                        max_steps * task.train_defaults["batch_size"])

        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if not isinstance(head, nn.Linear) or getattr(task, "name", None) != "lm":
            raise HeadwiseError(f"a cached teacher serves causal LMs on the lm task (logits = output head of the "
                                f"last hidden states); for {getattr(task, 'name', task)} pass the model from before "
                                "the edit (copy.deepcopy(model))")
        device = head.weight.device
        copy_ = nn.Linear(head.in_features, head.out_features, bias=head.bias is not None, device=device,
                          dtype=head.weight.dtype)
        copy_.load_state_dict(head.state_dict())
        hidden = {}
        with eval_mode(model):
            for example in progress_bar(task.examples(tokenizer, "train").head(limit).items, desc="teacher outputs",
                                        unit="window", disable=not progress):
                ids = torch.tensor(example["input_ids"], device=device)[None]
                hidden[cls._key(ids[0])] = model.base_model(input_ids=ids).last_hidden_state[0]
        return cls(hidden, copy_.requires_grad_(False), limit)

    @staticmethod
    def _key(ids: torch.Tensor) -> bytes:
        return ids.to("cpu", torch.long).numpy().tobytes()

    def outputs(self, task: Task, batch: dict[str, torch.Tensor]) -> TaskOutputs:
        """The recorded model's ``TaskOutputs`` on ``batch`` (its rows must be recorded windows): its hidden states
        and the copy of its head, as the lm task's ``outputs`` gives them."""
        try:
            hidden = torch.stack([self.hidden[self._key(row)] for row in batch["input_ids"]])
        except KeyError:
            raise HeadwiseError("a batch holds a window the cached teacher did not record; record the teacher on "
                                "the same task, data and limit as the recovery") from None
        return task.outputs_from(hidden.to(self.head.weight.device)[:, :-1], batch, self.head)


class DistillationObjective(nn.Module):
    """``forward(**batch) -> {"loss", "task_loss", "distill_loss"}``: the student's task loss blended with its
    distillation loss toward ``teacher`` (kept out of the module tree: never trained, saved or wrapped by DDP;
    moved to the batch's device on first use), or toward the student itself with its headwise ops switched off
    (``teacher="off"``: no second model)."""

    def __init__(self, task: Task, model: nn.Module, teacher: nn.Module | str, *, alpha: float = 0.5,
                 temperature: float = 2.0, distance: str = "mse") -> None:
        super().__init__()
        if isinstance(teacher, str) and teacher != OFF:
            raise HeadwiseError(f"teacher={teacher!r}; pass a model or {OFF!r} (the student with its ops off)")
        self.task, self.model = task, model
        self._teacher = [teacher if teacher == OFF or isinstance(teacher, CachedTeacher) else teacher.eval()]
        self.alpha, self.temperature, self.distance = alpha, temperature, distance

    @property
    def teacher(self) -> nn.Module | str:
        return self._teacher[0]

    def _target(self, batch: dict[str, torch.Tensor], device: torch.device):
        """The teacher's ``TaskOutputs`` on ``batch`` (no gradient)."""
        with torch.no_grad():
            if self.teacher == OFF:
                with switched_off(self.model):
                    return self.task.outputs(self.model, batch)
            if isinstance(self.teacher, CachedTeacher):
                return self.teacher.outputs(self.task, batch)
            if next(self.teacher.parameters()).device != device:
                self._teacher[0] = self.teacher.to(device)
            return self.task.outputs(self.teacher, batch)

    def forward(self, **batch: torch.Tensor) -> dict[str, torch.Tensor]:
        student = self.task.outputs(self.model, batch)
        target = self._target(batch, student.values.device)
        both = getattr(self.task, "loss_and_distillation", None)  # one pass over a causal LM's logits for both
        if both is not None and student.head is not None:
            task_loss, distill = (value.mean() for value in both(student, target, batch, self.temperature))
        else:
            task_loss = self.task.loss_from(student, batch).mean()
            distill = distillation_loss(student, target, temperature=self.temperature,
                                        distance=self.distance).mean()
        return {"loss": (1 - self.alpha) * task_loss + self.alpha * distill, "task_loss": task_loss.detach(),
                "distill_loss": distill.detach()}


def recover(model: nn.Module, tokenizer: Any, task: Task | str, *, teacher: nn.Module | str | None = None,
            mode: str = "distill", epochs: float = 1.0, max_steps: int = -1, alpha: float = 0.5,
            temperature: float = 2.0, distance: str = "mse", limit: int | None = None, seed: int = 0,
            progress: bool = True, **train_args: Any) -> nn.Module:
    """Recover ``model`` (in place) after an edit; returns it in eval mode.

    ``mode``: ``"distill"`` (task loss + distillation from ``teacher``: the unedited model, or ``"off"`` for
    the student with its headwise ops switched off, see the module docstring), ``"finetune"`` (the
    task's own fine-tuning recipe) or ``"none"`` (the model untouched). ``alpha``: weight of the distillation loss
    (0–1); ``temperature``: softening of logits; ``distance``: ``"mse"`` or ``"cosine"`` for embedding tasks
    (STS-B, regression). ``limit``: train examples; ``train_args``: batch_size, learning_rate, penalties,
    output_dir and resume (checkpoints), ... (``train_objective``)."""
    task = get_task(task)
    check_recovery(mode, epochs, max_steps, alpha, temperature, distance)
    if mode == "none":
        return model.eval()
    if mode == "finetune":
        return finetune(model, tokenizer, task, epochs=epochs, max_steps=max_steps, limit=limit, seed=seed,
                        progress=progress, **train_args)
    if teacher is None:
        raise HeadwiseError("mode 'distill' needs teacher= ('off' after a reversible edit, else the unedited model, "
                            "e.g. copy.deepcopy(model) taken before the edit); or use mode='finetune'")
    if teacher is model:
        raise HeadwiseError("the teacher is the student itself; pass teacher='off' (its headwise ops switched off) "
                            "or a copy of the model taken before the edit")
    if teacher == OFF:
        if not has_ops(model):
            raise HeadwiseError("teacher='off' switches off the model's headwise ops, but it has none (the edit "
                                "rewrote weights): pass the model from before the edit, e.g. copy.deepcopy(model)")
    elif not isinstance(teacher, CachedTeacher):
        task.check_model(teacher, tokenizer)
    objective = DistillationObjective(task, model, teacher, alpha=alpha, temperature=temperature, distance=distance)
    train_objective(objective, tokenizer, task, epochs=epochs, max_steps=max_steps, limit=limit, seed=seed,
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


@dataclass(frozen=True)
class Recovery:
    """How an edited model recovers (``headwise.recover``): ``mode`` (``none``, ``finetune``, ``distill``),
    ``epochs``, ``steps`` (-1: no limit), the distillation's ``alpha``, ``temperature`` and ``distance``,
    ``memory`` (``training.memory``) and ``teacher``: None (the default for the edit), ``"off"``,
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
