"""After L0 training: keep exactly the chosen number of heads, fold their gate values, remove the rest."""

from __future__ import annotations

import torch
from torch import nn

from .finalize import prune_masked
from .l0 import l0_gates, l0_keep
from .masks import apply_masks
from ..sites import find_sites

OPEN_LOG_ALPHA = 10.0  # eval gate exactly 1


@torch.no_grad()
def keep_l0_heads(model: nn.Module, keep: int, remove: bool = True) -> dict[str, list[int]]:
    """After L0 training: keep exactly ``keep`` heads (``l0_keep``), fold their gate values and remove the rest
    (``remove=False``: only mask them, e.g. when grouped-query sites lose part of a key/value group). A kept head
    whose gate closed (the best of an emptied layer) is reopened at gate 1. Returns ``{site: removed heads}``."""
    masks = l0_keep(model, keep)
    for path, gate in l0_gates(model).items():
        shut = torch.tensor(masks[path], device=gate.log_alpha.device).bool() & (gate.eval_gates() == 0)
        gate.log_alpha[shut] = OPEN_LOG_ALPHA
    apply_masks(model, masks)
    if remove:
        return prune_masked(model)
    names = {s.path: s.name for s in find_sites(model)}
    return {names[p]: [h for h, m in enumerate(mask) if not m] for p, mask in masks.items() if not all(mask)}
