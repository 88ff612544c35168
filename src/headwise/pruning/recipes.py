"""End-to-end pruning recipes on a sentence encoder and STS-B (what ``headwise prune`` runs)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..tasks import read_stsb
from ..errors import HeadwiseError
from ..sites import find_sites
from ..training import finetune_stsb
from .finalize import prune_masked
from .l0 import L0Config, L0Penalty, add_l0_gates, l0_gates, l0_keep
from .masks import apply_masks
from .schedule import Metric, PruningCurve, importance_pruning

OPEN_LOG_ALPHA = 10.0  # eval gate exactly 1


def l0_prune(model: nn.Module, tokenizer: Any, keep: int, *, config: L0Config | None = None, epochs: float = 1.0,
             head_learning_rate: float = 0.1, data: str | None = None, progress: bool = True,
             **train: Any) -> dict[str, list[int]]:
    """Train L0 gates toward ``keep`` open heads while fine-tuning on STS-B train, keep exactly the ``keep``
    heads of largest ``log α``, fold their gate values and remove the rest. Returns ``{site: removed heads}``.

    Default config: λ from 0 by dual ascent (``lambda_lr=0.01``), the target reached linearly over the first
    half of training, gates starting open (``log α = 3``). ``l0_keep`` keeps the best head of every layer; if
    training shut every gate of a layer, that head comes back with gate 1 (fine-tune afterwards to adapt)."""
    if config is None:
        pairs = len(read_stsb("train", data))
        steps = train.get("max_steps", -1)
        if steps is None or steps <= 0:
            steps = math.ceil(math.ceil(pairs / train.get("batch_size", 16)) * epochs
                              / train.get("gradient_accumulation_steps", 1))
        config = L0Config(lam=0.0, target_heads=keep, lambda_lr=0.01, target_warmup=steps // 2, init=3.0)
    if config.target_heads != keep:
        raise HeadwiseError(f"config.target_heads ({config.target_heads}) differs from keep ({keep})")
    add_l0_gates(model, config)
    finetune_stsb(model, tokenizer, epochs=epochs, penalties=[L0Penalty(model, config)],
                  head_learning_rate=head_learning_rate, data=data, progress=progress, **train)
    return keep_l0_heads(model, keep)


@torch.no_grad()
def keep_l0_heads(model: nn.Module, keep: int) -> dict[str, list[int]]:
    """After L0 training: keep exactly ``keep`` heads (``l0_keep``), fold their gate values and remove the rest.
    A kept head whose gate closed (the best of an emptied layer) is reopened at gate 1. Returns ``{site: removed}``."""
    masks = l0_keep(model, keep)
    for path, gate in l0_gates(model).items():
        shut = torch.tensor(masks[path], device=gate.log_alpha.device).bool() & (gate.eval_gates() == 0)
        gate.log_alpha[shut] = OPEN_LOG_ALPHA
    apply_masks(model, masks)
    return prune_masked(model)


def importance_prune(model: nn.Module, tokenizer: Any, keep: int, *, iterative: bool = False, step: int | None = None,
                     importance_pairs: int = 256, metric: Metric | None = None, data: str | None = None,
                     progress: bool = True) -> PruningCurve:
    """Mask heads by gradient importance (STS-B train objective on ``importance_pairs`` pairs) down to ``keep``,
    ``step`` heads at a time (default 10%; ``iterative`` recomputes importance each time), evaluating
    ``metric`` at each step, then remove the masked heads physically."""
    total = sum(s.num_heads for s in find_sites(model))
    train = read_stsb("train", data)
    pairs = tuple(x[:importance_pairs] for x in (train.first, train.second, train.scores))
    step = step or max(1, total // 10)
    counts = list(range(total, keep, -step)) + [keep]
    curve = importance_pruning(model, tokenizer, pairs=pairs, keep=counts, iterative=iterative, metric=metric,
                               progress=progress)
    prune_masked(model)
    return curve
