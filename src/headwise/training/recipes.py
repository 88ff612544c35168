"""End-to-end pruning recipes on any task (what ``headwise prune`` runs): L0 gates trained with the task's loss,
and Michel-style importance pruning ranked by the task's loss, then physical removal."""

from __future__ import annotations

import math
from typing import Any

from torch import nn

from ..errors import HeadwiseError
from ..pruning import (L0Config, L0Penalty, L0Training, PruningCurve, add_l0_gates, importance_pruning, keep_l0_heads,
                       l0_keep, prune_masked)
from ..pruning.schedule import Metric
from ..sites import find_sites
from ..tasks import Task
from .finetune import finetune, train_objective
from .recovery import DistillationObjective, check_recovery


def l0_training(tokenizer: Any, keep: int, task: Task, epochs: float = 1.0, **train: Any) -> L0Training:
    """How ``l0_prune`` trains the gates by default: λ from 0 by dual ascent (``lambda_lr=0.01``) toward ``keep``
    open heads, the target reached linearly over the first half of the training ``train`` describes."""
    steps = train.get("max_steps", -1)
    if steps is None or steps <= 0:
        batch = train.get("batch_size") or task.train_defaults["batch_size"]
        examples = len(task.examples(tokenizer, "train").head(train.get("limit")))
        steps = math.ceil(math.ceil(examples / batch) * epochs / train.get("gradient_accumulation_steps", 1))
    return L0Training(lam=0.0, target_heads=keep, lambda_lr=0.01, target_warmup=steps // 2)


def l0_prune(model: nn.Module, tokenizer: Any, keep: int, task: Task, *, config: L0Config | None = None,
             training: L0Training | None = None, epochs: float = 1.0, head_learning_rate: float = 0.1,
             teacher: nn.Module | None = None,
             alpha: float = 0.5, temperature: float = 2.0, distance: str = "mse", progress: bool = True,
             outcome: dict | None = None, **train: Any) -> dict[str, list[int]]:
    """Train L0 gates toward ``keep`` open heads while fine-tuning on the task's train split (its loss; with a
    ``teacher``, blended with distillation from it as in ``recover``), keep exactly the ``keep`` heads of largest
    ``log α``, fold their gate values and remove the rest (masked only when grouped-query sites would lose part of
    a key/value group, see ``removable``). Returns ``{site: removed heads}``; ``outcome`` (a dict, when given)
    receives what training reached: ``open_heads`` (gates open at the end, before the cut to ``keep``),
    ``target_heads`` and ``lambda`` (the final penalty weight).

    Defaults: gates starting open (``config``: ``log α = 3``); ``training``: ``l0_training``."""
    training = training or l0_training(tokenizer, keep, task, epochs, **train)
    if training.target_heads != keep:
        raise HeadwiseError(f"training.target_heads ({training.target_heads}) differs from keep ({keep})")
    add_l0_gates(model, config or L0Config(init=3.0))
    penalty = L0Penalty(model, training)
    if teacher is None:
        finetune(model, tokenizer, task, epochs=epochs, penalties=[penalty], head_learning_rate=head_learning_rate,
                 progress=progress, **train)
    else:
        check_recovery("distill", epochs, train.get("max_steps", -1), alpha, temperature, distance)
        objective = DistillationObjective(task, model, teacher, alpha=alpha, temperature=temperature,
                                          distance=distance)
        train_objective(objective, tokenizer, task, epochs=epochs, penalties=[penalty],
                        head_learning_rate=head_learning_rate, progress=progress, **train)
        model.eval()
    if outcome is not None:
        open_heads = int(sum(sum(mask) for mask in l0_keep(model).values()))
        outcome.update(open_heads=open_heads, target_heads=keep, **{"lambda": penalty.lam})
    return keep_l0_heads(model, keep, remove=removable(model, l0_keep(model, keep)))


def importance_prune(model: nn.Module, tokenizer: Any, keep: int, task: Task, *, iterative: bool = False,
                     step: int | None = None, examples: int = 256, batch_size: int = 8, unit: str = "query",
                     metric: Metric | None = None, remove: bool = True, progress: bool = True) -> PruningCurve:
    """Mask heads by gradient importance of the task's loss (on ``examples`` training examples) down to ``keep``
    query heads, ``step`` at a time (default 10%; ``iterative`` recomputes importance each time; ``unit``
    ``"kv-group"`` removes whole key/value groups), evaluating ``metric`` at each step, then remove the masked
    heads physically (``remove``; a grouped-query site that lost only some query heads of a group stays masked,
    see ``removable``)."""
    sites = find_sites(model)
    total = sum(s.num_heads for s in sites)
    inputs = task.batches(tokenizer, "train", batch_size, examples, next(model.parameters()).device)
    default_step = max(1, total // 10)
    if unit == "kv-group":
        group = max(s.group_size for s in sites)
        default_step = max(group, default_step // group * group)
    step = step or default_step
    counts = list(range(total, keep, -step)) + [keep]
    curve = importance_pruning(model, tokenizer, inputs=inputs, loss_fn=task.loss, keep=counts, unit=unit,
                               iterative=iterative, metric=metric, progress=progress)
    if remove and removable(model, curve.steps[-1].masks):
        prune_masked(model)
    return curve


def removable(model: nn.Module, masks: dict[str, list[float]]) -> bool:
    """Whether masked heads can be removed physically: under grouped-query attention a key/value group must lose
    all of its query heads or none (transformers' Llama needs the same number of query heads per group)."""
    for site in find_sites(model):
        mask, g = masks.get(site.path), site.group_size
        if mask is None or g == 1:
            continue
        groups = [mask[k * g:(k + 1) * g] for k in range(site.num_kv_heads)]
        if any(0 < sum(x) < g for x in groups):
            return False
    return True
