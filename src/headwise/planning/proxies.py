"""Cheap proxies that rank candidate edits before anything is measured on the task: head importance (gradient
of the task loss, or L0 gate logits after a short training of the gates alone) and the relative output error of
an edit applied in place on calibration batches (reconstruction / calibration error of a collaborative width, a
KV merge, a quantizer or a mechanism on one layer). Nothing here copies the model: every proxy leaves it as it
was, bit for bit."""

from __future__ import annotations

import math
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import nn

from ..analysis.importance import gradient_importance
from ..errors import HeadwiseError
from ..pruning import L0Config, L0Penalty, L0Training, add_l0_gates, l0_gates, remove_l0_gates
from ..pruning.schedule import site_importance
from ..runtime import using_headwise
from ..sites import find_sites
from ..tasks import Task
from ..tasks.lm import final_hidden, logit_rows
from .edits import Edit, edited

RANKINGS = ("gradient", "l0")
BACKWARD_TOKENS = 2048  # the most tokens (examples × max_length) one backward of the gradient ranking takes


def head_scores(model: nn.Module, tokenizer: Any, task: Task, ranking: str = "gradient", examples: int = 256,
                keep: int | None = None, epochs: float = 1.0, progress: bool | None = None,
                batch_size: int = 8) -> dict[str, list[float]]:
    """``{site name: [score per head]}``, higher = more important. ``"gradient"``: Michel et al. importance of the
    task loss on ``examples`` training examples; ``"l0"``: ``log α`` of Hard-Concrete gates trained toward ``keep``
    open heads with the task loss, every weight of the model frozen (only the gates train; they are removed
    after, and the model is left as it was). ``batch_size``: examples per backward of the gradient ranking
    (its peak memory: the activations of one batch, which keeps each block's input for the backward; cut to
    ``BACKWARD_TOKENS`` tokens of the task's ``max_length``, so long windows go one at a time; per-example scores
    do not depend on it beyond float rounding)."""
    if ranking not in RANKINGS:
        raise HeadwiseError(f"unknown head ranking {ranking!r}; use one of {', '.join(RANKINGS)}")
    names = {s.path: s.name for s in find_sites(model)}
    if ranking == "gradient":
        device = next(model.parameters()).device
        length = getattr(task, "max_length", None)
        batch_size = max(1, min(batch_size, BACKWARD_TOKENS // length)) if length else batch_size
        inputs = task.batches(tokenizer, "train", batch_size, examples, device)
        cross = any(s.kind == "dec-enc" for s in find_sites(model))  # encoder-decoders: rank cross-attention too
        table = gradient_importance(model, tokenizer, inputs=inputs, loss_fn=task.loss, progress=progress,
                                    cross_attention=cross)
        return {names[p]: [float(x) for x in v] for p, v in site_importance(model, table, cross).items()}
    total = sum(s.num_heads for s in find_sites(model))
    batch = task.train_defaults["batch_size"]
    steps = math.ceil(len(task.examples(tokenizer, "train").head(examples)) / batch * epochs)
    training = L0Training(lam=0.0, target_heads=keep or total // 2, lambda_lr=0.01, target_warmup=max(1, steps // 2))
    trainable = {n: p.requires_grad for n, p in model.named_parameters()}
    was_training = model.training
    stack = ExitStack()  # the attention implementation comes back last
    try:
        for p in model.parameters():
            p.requires_grad_(False)
        stack.enter_context(using_headwise(model))
        add_l0_gates(model, L0Config(init=3.0))
        task.finetune(model, tokenizer, epochs=epochs, limit=examples, penalties=[L0Penalty(model, training)],
                      head_learning_rate=0.1, progress=bool(progress))
        return {names[p]: [float(x) for x in g.log_alpha.detach().cpu()] for p, g in l0_gates(model).items()}
    finally:
        remove_l0_gates(model, missing_ok=True)
        for n, p in model.named_parameters():
            p.requires_grad_(trainable[n])
        model.train(was_training)
        stack.close()


def removal_order(model: nn.Module, scores: dict[str, list[float]], allow_empty_layers: bool = False
                  ) -> list[list]:
    """Removal units, least important first: ``(site name, heads)``, one query head each, or a whole key/value
    group (its query heads, summed scores) where a site shares key/value heads (so the removal is physical and
    shrinks the KV cache). Each site keeps one unit unless ``allow_empty_layers``."""
    units = []
    for site in find_sites(model):
        g = site.group_size
        for k in range(site.num_heads // g):
            heads = list(range(k * g, (k + 1) * g))
            units.append((sum(scores[site.name][h] for h in heads), site.name, heads))
    units.sort(key=lambda u: u[0])
    left = {s.name: s.num_heads // s.group_size for s in find_sites(model)}
    order = []
    for _, name, heads in units:
        if left[name] > (0 if allow_empty_layers else 1):
            order.append([name, heads])
            left[name] -= 1
    return order


@dataclass
class Outputs:
    """A model's outputs on calibration batches (float32), kept small: for a model whose logits are exactly
    ``head(hidden)`` (``tasks.lm.final_hidden``), the hidden states ``[B, T, D]`` its output embeddings ``head``
    read — the ``[B, T, V]`` logits are rebuilt chunk by chunk where they are compared; otherwise the logits
    (or last hidden states) themselves, and ``head`` is None."""

    values: list[torch.Tensor]
    head: nn.Module | None = None
    vocab: int = 0


def outputs(model: nn.Module, batches: Sequence[dict[str, torch.Tensor]]) -> Outputs:
    """The model's ``Outputs`` on ``batches``."""
    head = model.get_output_embeddings()
    found, values = [], []
    with torch.inference_mode():
        for b in batches:
            found.append(final_hidden(model, b) if isinstance(head, nn.Module) else None)
            if found[-1] is None:
                y = model(**b)
                values.append((y.logits if getattr(y, "logits", None) is not None else y[0]).float())
            else:
                values.append(found[-1][0].float())
        if all(f is not None for f in found) and found:
            return Outputs(values, head, found[0][1])
        return Outputs([v if f is None else head(v).float() for v, f in zip(values, found)])


def relative_error(reference: Outputs, got: Outputs) -> float:
    """``‖y − ŷ‖ / ‖y‖`` of the logits (or outputs) over all batches (padding positions included, identically
    on both sides); logits rebuilt from hidden states ``logit_rows`` positions at a time."""
    num = den = 0.0
    with torch.inference_mode():
        for a, b in zip(reference.values, got.values):
            a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
            step = logit_rows(reference.vocab or got.vocab) if reference.head or got.head else len(a)
            for i in range(0, len(a), step):
                ya, yb = _logits(a[i : i + step], reference.head), _logits(b[i : i + step], got.head)
                num, den = num + float((ya - yb).pow(2).sum()), den + float(ya.pow(2).sum())
    return math.sqrt(num / max(den, 1e-30))


def _logits(values: torch.Tensor, head: nn.Module | None) -> torch.Tensor:
    """``values`` themselves, or the logits ``head`` makes of them (float32)."""
    return values if head is None else head(values).float()


def output_error(model: nn.Module, edit: Edit, batches: Sequence[dict[str, torch.Tensor]],
                 reference: Outputs | None = None,
                 calibration: Sequence[dict[str, torch.Tensor]] | None = None) -> float:
    """``relative_error`` of ``model`` with ``edit`` applied in place (``edits.edited``; restored exactly after)
    against ``reference`` (the unedited outputs on ``batches``, computed when not given)."""
    reference = reference if reference is not None else outputs(model, batches)
    with edited(model, edit, calibration):
        return relative_error(reference, outputs(model, batches))
