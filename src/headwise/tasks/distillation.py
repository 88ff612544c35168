"""Distillation losses between a student's and a teacher's ``TaskOutputs`` (same batch, same task).

Logits: Hinton's soft targets, ``T² · KL(softmax(t / T) ‖ softmax(s / T))`` per position (the ``T²`` keeps the
gradient scale independent of ``T``), as CoFi and Sheared-LLaMA distil a pruned student. Embeddings: the mean
squared difference over the feature dimension (``"mse"``) or ``1 − cos`` (``"cosine"``). Both are averaged over the
positions the mask keeps (padding and unscored tokens excluded) into one value per example ``[B]``, in float32.
Logits that come as hidden states and an output head (a causal LM's ``TaskOutputs.head``) are distilled a chunk of
positions at a time (``headed_logit_distillation``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..errors import HeadwiseError
from .base import TaskOutputs

DISTANCES = ("mse", "cosine")


def logit_distillation(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor | None = None,
                       temperature: float = 1.0) -> torch.Tensor:
    """``[B, ..., V]`` logits (and a ``[B, ...]`` bool mask) → ``[B]`` mean over kept positions of
    ``T² · KL(p_teacher ‖ p_student)`` at temperature ``T``."""
    _check_temperature(temperature)
    log_s = F.log_softmax(student.float() / temperature, dim=-1)
    log_t = F.log_softmax(teacher.float() / temperature, dim=-1)
    kl = (log_t.exp() * (log_t - log_s)).sum(-1) * temperature**2
    return mean_over_positions(kl, mask)


def embedding_distillation(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor | None = None,
                           distance: str = "mse") -> torch.Tensor:
    """``[B, ..., D]`` embeddings (and a ``[B, ...]`` bool mask) → ``[B]`` mean over kept positions of the
    squared difference averaged over ``D`` (``"mse"``) or of ``1 − cos`` (``"cosine"``)."""
    if distance not in DISTANCES:
        raise HeadwiseError(f"distance {distance!r} is not one of {', '.join(DISTANCES)}")
    s, t = student.float(), teacher.float()
    if distance == "cosine":
        if s.shape[-1] < 2:
            raise HeadwiseError("distance 'cosine' needs embeddings of 2 or more features; use distance='mse'")
        per_position = 1 - F.cosine_similarity(s, t, dim=-1)
    else:
        per_position = (s - t).pow(2).mean(-1)
    return mean_over_positions(per_position, mask)


def headed_logit_distillation(student: TaskOutputs, teacher: TaskOutputs, temperature: float = 1.0
                              ) -> torch.Tensor:
    """``logit_distillation`` of outputs whose logits come through an output head (``TaskOutputs.head``, either
    side): ``[B]``, the logits built ``logit_rows(V)`` positions at a time (``headed_kl``), so no ``[B, T, V]``
    tensor exists, forward or backward."""
    return mean_over_positions(headed_kl(student, teacher, temperature), student.mask)


def headed_kl(student: TaskOutputs, teacher: TaskOutputs, temperature: float = 1.0,
              target: torch.Tensor | None = None) -> torch.Tensor:
    """Per position ``T² · KL(p_teacher ‖ p_student)`` ``[B, T]`` of outputs whose logits come through an output head
    (either side), ``logit_rows(V)`` positions at a time; with ``target`` ``[B, T]`` (≥ 0) also the student's
    next-token NLL of the same logits: ``[B, T, 2]`` (KL, NLL). Through the student's head (``tasks.lm.head_losses``)
    the backward rebuilds each chunk's logits and holds one gradient of the head's weight for both; student logits
    given whole are read a chunk at a time, each chunk checkpointed."""
    from .lm import head_losses, logit_rows, nll_of

    _check_temperature(temperature)
    s = student.values.reshape(-1, student.values.shape[-1])  # [N, D or V]
    t = teacher.values.reshape(-1, teacher.values.shape[-1])
    goal = None if target is None else target.reshape(-1)

    def losses(logits: torch.Tensor, rows: slice) -> torch.Tensor:  # student logits [n, V] → [n, 1 or 2]
        kl = _kl(logits, _logits(teacher, t[rows]), temperature)
        return kl[:, None] if goal is None else torch.stack([kl, nll_of(logits, goal[rows])], -1)

    if student.head is not None:
        values = head_losses(student.head, s, losses, student.classes)
    else:
        step = logit_rows(student.classes)
        spans = [slice(i, i + step) for i in range(0, len(s), step)]
        keep = torch.is_grad_enabled() and s.requires_grad
        values = torch.cat([checkpoint(lambda rows_s, rows=rows: losses(rows_s, rows), s[rows], use_reentrant=False)
                            if keep else losses(s[rows], rows) for rows in spans])
    shape = student.values.shape[:-1]
    return values.view(shape) if goal is None else values.view(*shape, 2)


def _kl(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """``T² · KL(softmax(t / T) ‖ softmax(s / T))`` ``[n]`` of logits ``[n, V]`` (float32), as
    ``T² · (Σ p_t log p_t − Σ p_t log p_s)``: the teacher's side without a gradient, so the graph keeps the
    student's log-probabilities and ``p_t`` only (four ``[n, V]`` tensors at most, not six)."""
    log_s = F.log_softmax(student.float() / temperature, dim=-1)
    with torch.no_grad():
        log_t = F.log_softmax(teacher.float() / temperature, dim=-1)
        p_t = log_t.exp()
        own = (p_t * log_t).sum(-1)
        del log_t
    return (own - (p_t * log_s).sum(-1)) * temperature**2


def _check_temperature(temperature: float) -> None:
    if temperature <= 0:
        raise HeadwiseError(f"temperature {temperature} must be > 0 (1 keeps the logits as they are; 2 is usual)")


def _logits(outputs: TaskOutputs, rows: torch.Tensor) -> torch.Tensor:
    return rows if outputs.head is None else outputs.head(rows)


def distillation_loss(student: TaskOutputs, teacher: TaskOutputs, *, temperature: float = 2.0,
                      distance: str = "mse") -> torch.Tensor:
    """Per-example distillation loss ``[B]`` of ``student`` toward ``teacher`` (logits: KL, embeddings: distance);
    the student's mask decides which positions count."""
    s_shape, t_shape = (*student.values.shape[:-1], student.classes), (*teacher.values.shape[:-1], teacher.classes)
    if student.kind != teacher.kind or s_shape != t_shape:
        raise HeadwiseError(f"student outputs ({student.kind}, {s_shape}) and teacher outputs ({teacher.kind}, "
                            f"{t_shape}) differ; the teacher must be the unedited model of the same task (same head, "
                            "same vocabulary)")
    if student.head is not None or teacher.head is not None:
        return headed_logit_distillation(student, teacher, temperature)
    if student.kind == "logits":
        return logit_distillation(student.values, teacher.values, student.mask, temperature)
    return embedding_distillation(student.values, teacher.values, student.mask, distance)


def mean_over_positions(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``[B, ...]`` → ``[B]``: the mean over the positions ``mask`` keeps (all when None)."""
    values = values.reshape(values.shape[0], -1)
    if mask is None:
        return values.mean(1)
    keep = mask.reshape(mask.shape[0], -1).to(values.dtype)
    return (values * keep).sum(1) / keep.sum(1).clamp(min=1)
