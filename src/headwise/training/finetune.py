"""A task's training through ``HeadwiseTrainer``: ``finetune`` (the model on the task's loss) and
``train_objective`` (any objective module around the model: distillation, gates), on the task's train split; both
run unchanged under ``torchrun``."""

from __future__ import annotations

import tempfile
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from ..batching import collate, pad_id_of
from ..errors import HeadwiseError
from ..tasks import Task, TaskObjective, get_task
from .memory import bounded as bounded_memory, choose_memory
from .trainer import HeadwiseTrainer


def finetune(model: nn.Module, tokenizer: Any, task: Task | str, **options: Any) -> nn.Module:
    """Fine-tune ``model`` in place on ``task``'s train split with its ``loss`` (``train_objective``'s options:
    penalties, head learning rate, callbacks, ...); returns it in eval mode."""
    task = get_task(task)
    train_objective(TaskObjective(task, model), tokenizer, task, **options)
    return model.eval()


def train_objective(objective: nn.Module, tokenizer: Any, task: Task | str, *, epochs: float = 1.0,
                    max_steps: int = -1, penalties: Sequence[Any] = (), head_learning_rate: float | None = None,
                    callbacks: Sequence[Any] = (), limit: int | None = None, batch_size: int | None = None,
                    learning_rate: float | None = None, seed: int = 0, progress: bool = True,
                    output_dir: str | None = None, resume: bool = False, memory: str = "keep",
                    **training_args: Any) -> None:
    """Train ``objective`` (a module whose ``forward(**batch)`` returns ``{"loss": scalar}``, e.g.
    ``TaskObjective``) on ``task``'s train split (its first ``limit`` examples) with ``HeadwiseTrainer``.

    ``output_dir``: keep checkpoints there (every ``save_steps``; default: a temporary folder, no checkpoints);
    ``resume``: continue from its last checkpoint; ``memory``: ``"keep"``, ``"bounded"`` (blocks recomputed,
    each parameter updated in the backward, no global-norm clipping) or ``"auto"`` (``training.memory``).
    ``training_args``: any other ``TrainingArguments``."""
    from transformers import TrainingArguments, set_seed
    from transformers.trainer_utils import get_last_checkpoint

    task = get_task(task)
    model = getattr(objective, "model", objective)
    bounded = choose_memory(memory, model) == "bounded"
    if bounded:
        training_args.setdefault("max_grad_norm", 0.0)  # no global norm: gradients never coexist
    if resume and not (output_dir and Path(output_dir).is_dir() and get_last_checkpoint(output_dir)):
        raise HeadwiseError(f"resume: no checkpoint in {output_dir}; train without resume first")
    data = task.examples(tokenizer, "train").head(limit)
    if not len(data):
        raise HeadwiseError(f"task {task.name}: the train split holds no examples")
    set_seed(seed)
    args = TrainingArguments(
        output_dir=output_dir or tempfile.mkdtemp(prefix="headwise-train-"), num_train_epochs=epochs,
        max_steps=max_steps, per_device_train_batch_size=batch_size or task.train_defaults["batch_size"],
        learning_rate=learning_rate or task.train_defaults["learning_rate"],
        warmup_steps=training_args.pop("warmup_steps", 0.1), seed=seed, data_seed=seed,
        save_strategy=training_args.pop("save_strategy", "steps" if output_dir else "no"), report_to="none",
        remove_unused_columns=False, disable_tqdm=not progress, logging_steps=training_args.pop("logging_steps", 50),
        use_cpu=training_args.pop("use_cpu", not torch.cuda.is_available()), **training_args)
    trainer = HeadwiseTrainer(model=objective, args=args, train_dataset=data.items,
                              data_collator=lambda items: collate(items, pad_id_of(tokenizer)),
                              penalties=penalties, head_learning_rate=head_learning_rate,
                              callbacks=list(callbacks), step_in_backward=bounded)
    with bounded_memory(model) if bounded else nullcontext():
        trainer.train(resume_from_checkpoint=True if resume else None)
