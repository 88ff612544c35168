"""The single-method candidates of a plan, each one edit of the whole model at one level: heads removed (by the
ranking), key/value heads merged, collaborative width, a local window on the layers it disturbs least, and
attention-probability quantization / thresholding. A method the model cannot take is skipped with its reason."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from ..errors import HeadwiseError
from ..progress import progress_bar
from ..sites import find_sites
from .edits import Edit
from .proxies import Outputs, output_error, prune_edit

PRUNE_FRACTIONS = (0.0625, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75)
DK_FRACTIONS = (0.75, 0.5, 0.375, 0.25, 0.125)
QUANTIZERS = ({"method": "linear_slog_clamped_midval", "bits": 3}, {"method": "none", "threshold": 0.01})
MIN_WINDOW = 16  # a local window is tried when sequences hold at least 4 windows of this size


@dataclass
class Candidate:
    name: str  # e.g. "prune-36", "dk-0.25"
    method: str  # one of edits.METHODS
    edit: Edit
    proxy: float | None = None  # relative output error on the calibration batches


def prune_candidates(model: nn.Module, order: Sequence[tuple[str, list[int]]], budget_heads: int | None
                     ) -> list[Candidate]:
    """Heads removed at fixed fractions of the model's heads (and at the budget's head count)."""
    total = sum(s.num_heads for s in find_sites(model))
    most = sum(len(h) for _, h in order)
    wanted = {round(f * total) for f in PRUNE_FRACTIONS}
    if budget_heads is not None:
        wanted.add(total - budget_heads)
    out, seen = [], set()
    for remove in sorted(w for w in wanted if 0 < w <= most):
        edit = prune_edit(order, remove)
        if edit.removed in seen:
            continue
        seen.add(edit.removed)
        out.append(Candidate(f"prune-{total - edit.removed}", "prune", edit))
    return out


def kv_candidates(model: nn.Module) -> tuple[list[Candidate], str | None]:
    """Fewer key/value heads per decoder layer (every divisor below today's count, the three largest)."""
    sites = [s for s in find_sites(model) if s.causal and s.kind == "dec-self"]
    if not sites:
        return [], "no decoder self-attention"
    now = min(s.num_kv_heads for s in sites)
    options = [k for k in range(now - 1, 0, -1) if all(s.num_heads % k == 0 for s in sites)][:3]
    return [Candidate(f"kv-{k}", "kv_heads", Edit(kv_heads=k)) for k in options], None if options else \
        "already one key/value head per layer"


def dk_candidates(model: nn.Module) -> list[Candidate]:
    """Collaborative widths as shares of each site's heads × head dim: combined with heads removed, a layer
    keeps that share of the heads it has left."""
    return [Candidate(f"dk-{f:g}", "dk", Edit(dk=f)) for f in DK_FRACTIONS]


def quantization_candidates() -> list[Candidate]:
    out = []
    for q in QUANTIZERS:
        name = f"quant-{q['method']}-{q['bits']}b" if q["method"] != "none" else f"threshold-{q['threshold']:g}"
        out.append(Candidate(name, "quantization", Edit(quantization=dict(q))))
    return out


def mechanism_candidates(model: nn.Module, length: float, batches: Sequence[dict[str, torch.Tensor]],
                         reference: Outputs, progress: bool | None = None
                         ) -> tuple[list[Candidate], dict[str, float], str | None]:
    """A sliding local window (a quarter of the sequence, a power of two) on the half of the self-attention
    layers whose outputs it changes least, then on all; returns the candidates, the per-layer errors and why
    none (if so)."""
    window = 2 ** int(math.log2(max(length / 4, 1)))
    if window < MIN_WINDOW:
        return [], {}, f"sequences average {length:.0f} tokens: a local window of ≥ {MIN_WINDOW} would see them whole"
    sites = [s for s in find_sites(model) if s.kind != "dec-enc" and s.positions != "relative"]
    if not sites:
        return [], {}, "no self-attention site with absolute or rotary positions"
    errors = {}
    for site in progress_bar(sites, desc="local-window error per layer", unit="layer", disable=None if progress is None
                             else not progress):
        one = Edit(mechanism={"name": "local", "args": {"window": window}, "sites": [site.name]})
        try:
            errors[site.name] = output_error(model, one, batches, reference)
        except HeadwiseError as err:
            return [], {}, str(err)
    ranked = sorted(errors, key=errors.get)
    out = []
    for n in sorted({max(1, len(ranked) // 2), len(ranked)}):
        edit = Edit(mechanism={"name": "local", "args": {"window": window}, "sites": sorted(ranked[:n])})
        out.append(Candidate(f"local{window}-{n}L", "mechanism", edit))
    return out, errors, None
