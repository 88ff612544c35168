"""The shared STS-B fine-tuning recipe (sentence-transformers' ``CosineSimilarityLoss``:
``loss = mean_b (cos(u_b, v_b) − score_b / 5)²`` on mean-pooled embeddings), with its published defaults. It is the
``stsb`` task's own training path (``finetune`` → ``train_objective``) under the keyword names the recipes
and benchmarks use."""

from __future__ import annotations

from typing import Any, Sequence

from torch import nn
from transformers import TrainerCallback

from ..tasks import ensure_encoder, get_task
from .finetune import finetune
from .trainer import Penalty


def finetune_stsb(model: nn.Module, tokenizer: Any, *, epochs: float = 1.0, max_steps: int = -1, batch_size: int = 16,
                  learning_rate: float = 2e-5, warmup_ratio: float = 0.1, gradient_accumulation_steps: int = 1,
                  penalties: Sequence[Penalty] = (), head_learning_rate: float | None = None,
                  callbacks: Sequence[TrainerCallback] = (), data: str | None = None, limit: int | None = None,
                  seed: int = 0, progress: bool = True, **training_args: Any) -> nn.Module:
    """Fine-tune ``model`` (in place) on STS-B train with the cosine-similarity regression; returns the model.

    Defaults follow sentence-transformers' STS-B recipe (batch 16, lr 2e-5, 10% warm-up) for one epoch.
    ``penalties`` / ``head_learning_rate`` go to ``HeadwiseTrainer``; extra keyword arguments go to
    ``TrainingArguments``. Runs unchanged under ``torchrun`` / ``accelerate launch`` (each process gets its share).
    """
    ensure_encoder(model, "STS-B fine-tuning")
    training_args.setdefault("save_strategy", "no")
    training_args.setdefault("ddp_find_unused_parameters", True)  # gates of pruned-away heads get no gradient
    return finetune(model, tokenizer, get_task("stsb", data=data), epochs=epochs, max_steps=max_steps,
                    penalties=penalties, head_learning_rate=head_learning_rate, callbacks=callbacks, limit=limit,
                    batch_size=batch_size, learning_rate=learning_rate, seed=seed, progress=progress,
                    warmup_steps=warmup_ratio, gradient_accumulation_steps=gradient_accumulation_steps, **training_args)
