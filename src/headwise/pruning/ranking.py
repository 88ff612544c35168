"""How the planner orders heads for removal (the ``rank`` hook of ``prune_heads``): gradient importance of the task
loss, or the ``log α`` of L0 gates trained alone with the task loss; then removal units (a whole key/value group
where heads share one), least important first. ``task`` is any ``headwise.tasks.Task`` (read, never imported:
this package sits below the tasks)."""

from __future__ import annotations

import math
from contextlib import ExitStack
from typing import Any, Callable

from torch import nn

from ..analysis.importance import gradient_importance
from ..declaration import PlanContext, Ranking
from ..errors import HeadwiseError
from ..runtime import using_headwise
from ..sites import find_sites
from .config import L0Config, L0Training
from .l0 import L0Penalty, add_l0_gates, l0_gates, remove_l0_gates
from .schedule import site_importance

RANKINGS = ("gradient", "l0")
BACKWARD_TOKENS = 2048  # the most tokens (examples × max_length) one backward of the gradient ranking takes


def head_scores(model: nn.Module, tokenizer: Any, task: Any, ranking: str = "gradient", examples: int = 256,
                keep: int | None = None, epochs: float = 1.0, progress: bool | None = None,
                batch_size: int = 8, finetune: Callable[..., Any] | None = None) -> dict[str, list[float]]:
    """``{site name: [score per head]}``, higher = more important. ``"gradient"``: Michel et al. importance of the
    task loss on ``examples`` training examples; ``"l0"``: ``log α`` of Hard-Concrete gates trained toward ``keep``
    open heads with the task loss, every weight of the model frozen (only the gates train; they are removed
    after, and the model is left as it was). ``batch_size``: examples per backward of the gradient ranking
    (its peak memory: the activations of one batch, which keeps each block's input for the backward; cut to
    ``BACKWARD_TOKENS`` tokens of the task's ``max_length``, so long windows go one at a time; per-example scores
    do not depend on it beyond float rounding). ``finetune``: how ``"l0"`` trains the gates
    (``headwise.training.finetune``; this package sits below training)."""
    if ranking not in RANKINGS:
        raise HeadwiseError(f"unknown head ranking {ranking!r}; use one of {', '.join(RANKINGS)}")
    if ranking == "l0" and finetune is None:
        raise HeadwiseError("the 'l0' ranking trains gates: pass finetune=headwise.training.finetune")
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
        finetune(model, tokenizer, task, epochs=epochs, limit=examples, penalties=[L0Penalty(model, training)],
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


def rank(model: nn.Module, context: PlanContext) -> Ranking:
    """The ``rank`` hook: ``head_scores`` by ``context.ranking`` on the plan's task, then ``removal_order``."""
    scores = head_scores(model, context.tokenizer, context.task, context.ranking, context.examples,
                         context.budget_heads, progress=context.progress, batch_size=context.batch_size,
                         finetune=context.finetune)
    return Ranking(scores, removal_order(model, scores, context.allow_empty_layers))
