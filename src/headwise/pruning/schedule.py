"""Importance-based pruning (Michel et al. §D.3): rank heads by gradient importance and mask the least
important ones, either all at once from one ranking (one-shot) or a fraction at a time with the importance
recomputed under the current mask (iterative, as bertology's ``mask_heads``), evaluating a metric at every step.

A site shared by several layers (ALBERT) is one set of weights: its heads are ranked by the sum of their
importance over the layers it serves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import nn

from ..analysis.importance import Pairs, gradient_importance
from ..analysis.rows import rows_of
from ..errors import HeadwiseError, renamed_fields
from ..progress import progress_bar
from ..sites import find_sites
from .masks import apply_masks
from .declaration import UNITS  # query heads or whole key/value groups (light: the CLI shows it)

Metric = Callable[[nn.Module], float]


@dataclass
class PruningStep:
    kept: int
    metric: float | None
    masks: dict[str, list[float]]  # site path -> 0/1 per head


@renamed_fields(method="strategy")
@dataclass
class PruningCurve:
    strategy: str  # formerly method
    steps: list[PruningStep] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "steps": [s.__dict__ for s in self.steps]}


def site_importance(model: nn.Module, table: torch.Tensor, cross_attention: bool = False) -> dict[str, torch.Tensor]:
    """Fold a ``[rows, H]`` importance table into ``{site path: [H]}`` (summing the layers of shared sites);
    ``cross_attention``: the table has the ``dec-enc`` rows too (``gradient_importance(cross_attention=True)``)."""
    out: dict[str, torch.Tensor] = {}
    for row in rows_of(model, cross_attention):
        score = table[row.index, : row.site.num_heads].nan_to_num(0.0)
        out[row.site.path] = out.get(row.site.path, 0) + score
    return out


def _lowest(scores: dict[str, torch.Tensor], masks: dict[str, list[float]], n: int, min_per_site: int
            ) -> list[tuple[str, int]]:
    """The ``n`` lowest-scoring heads still open, never leaving a site with fewer than ``min_per_site``."""
    candidates = sorted((float(s[h]), path, h) for path, s in scores.items() for h in range(len(s)) if masks[path][h])
    open_left = {path: int(sum(m)) for path, m in masks.items()}
    chosen = []
    for _, path, h in candidates:
        if len(chosen) == n:
            break
        if open_left[path] > min_per_site:
            chosen.append((path, h))
            open_left[path] -= 1
    return chosen


def _lowest_groups(scores: dict[str, torch.Tensor], masks: dict[str, list[float]], n: int, group: dict[str, int],
                   min_per_site: int) -> list[tuple[str, int]]:
    """Whole key/value groups (their query heads), lowest summed importance first, until ``n`` query heads are
    chosen; a site keeps at least ``min_per_site`` groups."""
    candidates = sorted((float(s[k * group[p]:(k + 1) * group[p]].sum()), p, k) for p, s in scores.items()
                        for k in range(len(s) // group[p]) if masks[p][k * group[p]])
    open_left = {p: int(sum(m)) // group[p] for p, m in masks.items()}
    chosen: list[tuple[str, int]] = []
    for _, path, k in candidates:
        if len(chosen) + group[path] > n:
            continue
        if open_left[path] > min_per_site:
            chosen += [(path, h) for h in range(k * group[path], (k + 1) * group[path])]
            open_left[path] -= 1
    return chosen


def importance_pruning(model: nn.Module, tokenizer: Any, texts: Sequence[str] | None = None, *,
                       pairs: Pairs | None = None, inputs: Sequence[dict[str, torch.Tensor]] | None = None,
                       loss_fn: Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor] | None = None,
                       unit: str = "query", keep: Sequence[int], iterative: bool = False, metric: Metric | None = None,
                       floor: float | None = None, min_per_site: int = 1, batch_size: int = 32,
                       abs_scope: str = "example", progress: bool | None = None) -> PruningCurve:
    """Mask heads down to each count in ``keep`` (descending), evaluating ``metric(model)`` at every step.

    One-shot ranks once on the intact model; ``iterative`` recomputes gradient importance with the current mask
    applied before each step. With ``floor`` the schedule stops after the first step whose metric falls below
    it. The model keeps ``HeadMask`` ops named ``"mask"`` set to the last step's mask (call
    ``headwise.pruning.apply_masks`` with another step's ``masks`` to pick one, then ``prune_masked``).

    The objective: ``pairs`` (STS-B), ``inputs`` (ready batches) with ``loss_fn(model, batch) -> [B]`` (a task's
    loss), else the label-free default of ``gradient_importance``. ``unit``: ``"query"`` masks single query heads;
    ``"kv-group"`` masks whole key/value groups (every query head sharing a key/value head, ranked by their summed
    importance; this is what shrinks a grouped-query model's KV cache). ``keep`` counts query heads either way.
    """
    if unit not in UNITS:
        raise HeadwiseError(f"unknown pruning unit {unit!r}; use one of {', '.join(UNITS)}")
    sites = find_sites(model)
    group = {s.path: s.group_size for s in sites}
    total = sum(s.num_heads for s in sites)
    counts = sorted({int(k) for k in keep}, reverse=True)
    if not counts or counts[-1] < min_per_site * len(sites) or counts[0] > total:
        raise HeadwiseError(f"keep counts must lie between {min_per_site * len(sites)} (min_per_site={min_per_site} "
                            f"for each of {len(sites)} sites) and {total}, got {list(keep)}")
    if floor is not None and metric is None:
        raise HeadwiseError("a metric floor needs a metric callable")
    if unit == "kv-group":
        sizes = {s.group_size for s in sites}
        step = max(sizes)
        bad = [k for k in counts if (total - k) % step]
        if len(sizes) == 1 and bad:
            raise HeadwiseError(f"with unit kv-group heads go {step} at a time (one key/value group); keep {bad[0]} "
                                f"query heads is not reachable from {total}: use a count with {total} − keep "
                                f"divisible by {step}")
    masks = {s.path: [1.0] * s.num_heads for s in sites}
    apply_masks(model, masks)

    def rank() -> dict[str, torch.Tensor]:
        table = gradient_importance(model, tokenizer, texts, pairs=pairs, inputs=inputs, loss_fn=loss_fn,
                                    batch_size=batch_size, abs_scope=abs_scope, progress=progress)
        return site_importance(model, table)

    curve = PruningCurve("iterative importance" if iterative else "one-shot importance")
    scores = rank()
    for kept in progress_bar(counts, desc=curve.strategy, unit="step",
                             disable=None if progress is None else not progress):
        open_now = sum(int(sum(m)) for m in masks.values())
        if iterative and open_now < total:
            scores = rank()
        chosen = (_lowest(scores, masks, open_now - kept, min_per_site) if unit == "query"
                  else _lowest_groups(scores, masks, open_now - kept, group, min_per_site))
        for path, h in chosen:
            masks[path][h] = 0.0
        apply_masks(model, masks)
        value = None if metric is None else float(metric(model))
        curve.steps.append(PruningStep(kept, value, {p: list(m) for p, m in masks.items()}))
        if floor is not None and value is not None and value < floor:
            break
    return curve


def keep_counts(total: int, lowest: int, step: float) -> list[int]:
    """``total``, then ``step`` of the heads fewer each time, down to ``lowest`` (bertology's 10% steps)."""
    if not 0 < step < 1:
        raise HeadwiseError(f"step must be a fraction in (0, 1), got {step}")
    size = max(1, math.floor(total * step))
    return sorted({*range(total, lowest, -size), lowest}, reverse=True)
