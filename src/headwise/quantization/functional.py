"""SPIQA's attention-probability quantizers (Ji et al., Findings ACL 2021) as pure functions.

Each quantizer maps probabilities ``a`` (any shape, values in [0, 1]) to a tensor of the same shape, computed in
float32. ``bits`` = b gives ``2^b`` output codes, the zero code included, unless stated. ``floor`` is the pruning
floor ``p_min`` (1e-3) of the variants "with pruning". Defaults reproduce the published torch code (levels:
docs/quantization.md); its quirks have switches:

- ``top_edge="reference"``: an input of exactly 1.0 becomes ``1 + w/2`` (``> 1``) in the midpoint variants and 0
  in the data-dependent ones; ``"clamp"`` maps it to the top level instead.
- ``zeros="reference"``: ``uniform_slog_mean`` turns exact zeros into its lowest level; ``"keep"`` leaves them 0.
- ``bin_value="reference"``: ``uniform_slinear_clamped_mean`` outputs bin *midpoints*; ``"mean"`` the mean of the
  values in each bin (what the seed's README describes).
- ``scope="tensor"``: ``binarization`` divides by the kept count of the whole tensor; ``"row"`` per row, so rows
  sum to 1.

Data-dependent quantizers take their bins from ``a[valid]`` (``valid``: bool, broadcastable to ``a``; None = all),
so padding never moves a bin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from .config import FLOOR
LOG_MIN = 1e-10  # low end of linear_slog_midval's log2 range


def prune(a: torch.Tensor, threshold: float) -> torch.Tensor:
    """``a · 1[a > threshold]`` (strict), no renormalisation."""
    return a * (a > threshold)


def _half_up(x: torch.Tensor) -> torch.Tensor:
    return torch.floor(x + 0.5)


def _zero(a: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=a.dtype, device=a.device)


# ------------------------------------------------------------------------------------ element-wise quantizers


def linear_slinear(a: torch.Tensor, bits: int) -> torch.Tensor:
    """Uniform grid ``k/(2^b − 1)`` on [0, 1] (0 and 1 included), nearest level."""
    n = 2**bits - 1
    return _half_up(a.float() * n) / n


def linear_slinear_midval(a: torch.Tensor, bits: int, *, top_edge: str = "reference") -> torch.Tensor:
    """Bins ``[k/2^b, (k+1)/2^b)``; bin k ≥ 1 outputs its midpoint, bin 0 outputs 0."""
    n = 2**bits
    k = torch.floor(a.float() * n)
    if top_edge == "clamp":
        k = k.clamp(max=n - 1)
    return torch.where(k >= 1, (k + 0.5) / n, _zero(k))


def linear_slinear_clamped(a: torch.Tensor, bits: int, *, floor: float = FLOOR) -> torch.Tensor:
    """Grid ``floor + k·w`` with ``w = (1 − floor)/(2^b − 1)``, nearest level; 0 at or below ``floor + w/2``."""
    a = a.float()
    w = (1 - floor) / (2**bits - 1)
    q = floor + _half_up((a - floor) / w) * w
    return torch.where(a > floor + w / 2, q, _zero(q))


def linear_slinear_clamped_midval(a: torch.Tensor, bits: int, *, floor: float = FLOOR,
                                  top_edge: str = "reference") -> torch.Tensor:
    """Bins ``[floor + k·w, floor + (k+1)·w)``, ``w = (1 − floor)/2^b``; midpoints for k ≥ 1, else 0."""
    n = 2**bits
    w = (1 - floor) / n
    k = torch.floor((a.float() - floor) / w)
    if top_edge == "clamp":
        k = k.clamp(max=n - 1)
    return torch.where(k >= 1, floor + (k + 0.5) * w, _zero(k))


def linear_slog(a: torch.Tensor, bits: int, *, floor: float = FLOOR) -> torch.Tensor:
    """Levels ``2^(k·s)``, ``s = log2(floor)/(2^b − 1)``, k = 0..2^b−2 (1.0 included), nearest in log2;
    inputs below the lowest level ``2^((2^b−2)·s)`` become 0."""
    s = math.log2(floor) / (2**bits - 1)
    e = torch.log2(a.float())
    q = torch.exp2(_half_up(e / s) * s)
    return torch.where(e >= (2**bits - 2) * s, q, _zero(q))


def linear_slog_midval(a: torch.Tensor, bits: int, *, top_edge: str = "reference") -> torch.Tensor:
    """log2 range [log2 1e-10, 0] in ``2^b`` bins of width ``w``; bin k ≥ 1 outputs ``2^(lower edge + w/2)``,
    bin 0 outputs 0 (so hardly anything is pruned)."""
    e_min, n = math.log2(LOG_MIN), 2**bits
    w = -e_min / n
    k = torch.floor((torch.log2(a.float()) - e_min) / w)
    if top_edge == "clamp":
        k = k.clamp(max=n - 1)
    return torch.where(k >= 1, torch.exp2(e_min + (k + 0.5) * w), _zero(k))


def linear_slog_clamped_midval(a: torch.Tensor, bits: int, *, floor: float = FLOOR) -> torch.Tensor:
    """The paper's log method: log2 range [log2 floor, 0] in ``2^b − 1`` bins of width ``w``, each outputs
    ``2^(lower edge + w/2)``; 1.0 joins the top bin; inputs below ``floor`` become 0."""
    a = a.float()
    e_min, n = math.log2(floor), 2**bits - 1
    w = -e_min / n
    k = torch.floor((torch.log2(a) - e_min) / w).clamp(max=n - 1)
    q = torch.exp2(e_min + (k + 0.5) * w)
    return torch.where(a >= floor, q, _zero(q))


# ------------------------------------------------------------------------------------ data-dependent quantizers


def _population(a: torch.Tensor, valid: torch.Tensor | None, above: float | None = None) -> torch.Tensor:
    """The values bins are computed from (those ``> above`` if given), sorted, as float32."""
    values = a.float() if valid is None else a.float()[valid.expand_as(a)]
    if above is not None:
        values = values[values > above]
    return values.flatten().sort().values


def _segment_means(values: torch.Tensor, cuts: torch.Tensor) -> torch.Tensor:
    """Means of ``values[cuts[m]:cuts[m+1]]``; an empty segment repeats the previous mean (with one value
    only, every segment is that value)."""
    csum = torch.cat([values.new_zeros(1, dtype=torch.float64), values.double().cumsum(0)])
    sums, sizes = csum[cuts[1:]] - csum[cuts[:-1]], (cuts[1:] - cuts[:-1])
    if not bool((sizes > 0).any()):
        return values[:1].expand(len(sizes)).clone()
    index = torch.arange(len(sizes), device=values.device)
    last_full = torch.where(sizes > 0, index, 0).cummax(0).values
    return (sums / sizes.clamp(min=1)).float()[last_full]


def _halving_cuts(n: int, count: int, device: torch.device) -> torch.Tensor:
    """``[0, c_1, ..., c_count]`` with ``c_m = Σ_{i=1..m} floor(n / 2^i)``."""
    shifts = torch.arange(1, count + 1, device=device).clamp(max=62)
    return torch.cat([torch.zeros(1, dtype=torch.long, device=device), (n >> shifts).cumsum(0)])


def _lookup(a: torch.Tensor, edges: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``values[j]`` where j = (number of edges ≤ a) − 1, clipped to the last value; 0 below the first edge."""
    j = torch.searchsorted(edges, a.float().contiguous(), right=True) - 1
    q = values[j.clamp(0, len(values) - 1)]
    return torch.where(j >= 0, q, _zero(q))


def _top(a: torch.Tensor, q: torch.Tensor, top_edge: str) -> torch.Tensor:
    """The reference sends inputs ≥ 1 to 0; ``"clamp"`` keeps their top-level value."""
    return q if top_edge == "clamp" else torch.where(a >= 1, _zero(q), q)


def uniform_slinear_clamped_mean(a: torch.Tensor, bits: int, *, valid: torch.Tensor | None = None,
                                 floor: float = FLOOR, top_edge: str = "reference",
                                 bin_value: str = "reference") -> torch.Tensor:
    """Equal-population bins over the sorted values ``P > floor`` (N of them): edges ``floor, P[s], P[2s], ...``
    with ``s = max(N // (2^b − 1), 1)``; bin m outputs the midpoint of its edges (``bin_value="mean"``: the mean
    of its values); the top partial bin joins the one below; below ``floor`` → 0. The number of levels is not
    fixed by b (it can exceed ``2^b − 1`` for N < (2^b − 1)^2). With one bin only (b = 1) the bin runs from
    ``floor`` to the largest value (the reference indexes an empty list there)."""
    pop = _population(a, valid, above=floor)
    if pop.numel() == 0:
        return torch.zeros_like(a, dtype=torch.float32)
    step = max(pop.numel() // (2**bits - 1), 1)
    edges = torch.cat([pop.new_full((1,), floor), pop[step::step]])
    upper = edges[1:] if len(edges) > 1 else pop[-1:]
    values = (edges[: len(upper)] + upper) / 2
    if bin_value == "mean":
        j = (torch.searchsorted(edges, pop, right=True) - 1).clamp(max=len(values) - 1)
        if top_edge != "clamp":
            j = torch.where(pop >= 1, len(values), j)  # these map to 0: leave them out of the means
        sums = torch.zeros(len(values) + 1, dtype=torch.float64, device=pop.device).index_add_(0, j, pop.double())
        counts = torch.bincount(j, minlength=len(values) + 1)
        values = torch.where(counts[:-1] > 0, (sums[:-1] / counts[:-1].clamp(min=1)).float(), values)
    return _top(a, _lookup(a, edges, values), top_edge)


def uniform_slog_clamped_mean(a: torch.Tensor, bits: int, *, valid: torch.Tensor | None = None,
                              floor: float = FLOOR, top_edge: str = "reference") -> torch.Tensor:
    """Geometrically shrinking bins over the sorted values ``P > floor``: the lowest half of P shares one level,
    the next quarter the next, ...; ``2^b − 1`` levels (segment means) plus 0; the top ``≈ N / 2^(2^b − 1)``
    values take the last level; below ``floor`` → 0."""
    pop = _population(a, valid, above=floor)
    if pop.numel() == 0:
        return torch.zeros_like(a, dtype=torch.float32)
    cuts = _halving_cuts(pop.numel(), 2**bits - 1, pop.device)  # c_0 .. c_{K-1}
    values = _segment_means(pop, cuts)  # v_0 .. v_{K-2}
    edges = torch.cat([pop.new_full((1,), floor), pop[cuts[1:]]])  # floor, t_1 .. t_{K-1}
    return _top(a, _lookup(a, edges, values), top_edge)


def uniform_slog_mean(a: torch.Tensor, bits: int, *, valid: torch.Tensor | None = None,
                      top_edge: str = "reference", zeros: str = "reference") -> torch.Tensor:
    """As ``uniform_slog_clamped_mean`` without pruning: bins over all values (zeros included), ``2^b`` levels,
    no zero code. An exact 0 takes the lowest level (unless the lowest cut is itself 0); ``zeros="keep"`` keeps
    it 0."""
    pop = _population(a, valid)
    if pop.numel() == 0:
        return torch.zeros_like(a, dtype=torch.float32)
    cuts = _halving_cuts(pop.numel(), 2**bits, pop.device)  # c_0 .. c_K
    values = _segment_means(pop, cuts)  # v_0 .. v_{K-1}
    edges = torch.cat([pop.new_zeros(1) - math.inf, pop[cuts[1:]]])  # -inf, t_1 .. t_K
    q = _lookup(a, edges, values)
    if zeros == "keep" or bool(edges[1] == 0):
        q = torch.where(a == 0, _zero(q), q)
    return _top(a, q, top_edge)


def binarization(a: torch.Tensor, bits: int = 1, *, valid: torch.Tensor | None = None, floor: float = FLOOR,
                 scope: str = "tensor") -> torch.Tensor:
    """0 below ``floor``; every other entry ``1 / n_kept``, with n_kept counted over the (valid part of the) whole
    tensor (reference; rows do not sum to 1) or per row (``scope="row"``). ``bits`` is ignored."""
    kept = a.float() >= floor
    if scope == "row":
        count = kept.sum(-1, keepdim=True)
    else:
        count = (kept if valid is None else kept & valid).sum()
    return torch.where(kept, 1.0 / count.clamp(min=1).float(), _zero(a.float()))


# ------------------------------------------------------------------------------------ registry


@dataclass(frozen=True)
class Quantizer:
    """A quantizer and what it is: its scale, the value it assigns, whether it prunes, which options it takes."""

    fn: Callable[..., torch.Tensor]
    scale: str  # "linear" | "log" | "binary"
    value: str  # "closest edge" | "midpoint" | "bin mean" | "1/n"
    prunes: bool  # has a floor below which values become 0
    options: tuple[str, ...] = ()
    data_dependent: bool = False


QUANTIZERS: dict[str, Quantizer] = {
    "linear_slinear": Quantizer(linear_slinear, "linear", "closest edge", False),
    "linear_slinear_midval": Quantizer(linear_slinear_midval, "linear", "midpoint", False, ("top_edge",)),
    "linear_slinear_clamped": Quantizer(linear_slinear_clamped, "linear", "closest edge", True, ("floor",)),
    "linear_slinear_clamped_midval": Quantizer(linear_slinear_clamped_midval, "linear", "midpoint", True,
                                            ("floor", "top_edge")),
    "linear_slog": Quantizer(linear_slog, "log", "closest edge", False, ("floor",)),
    "linear_slog_midval": Quantizer(linear_slog_midval, "log", "midpoint", False, ("top_edge",)),
    "linear_slog_clamped_midval": Quantizer(linear_slog_clamped_midval, "log", "midpoint", True, ("floor",)),
    "uniform_slinear_clamped_mean": Quantizer(uniform_slinear_clamped_mean, "linear", "bin midpoint (mean: option)",
                                           True, ("floor", "top_edge", "bin_value"), True),
    "uniform_slog_clamped_mean": Quantizer(uniform_slog_clamped_mean, "log", "bin mean", True,
                                        ("floor", "top_edge"), True),
    "uniform_slog_mean": Quantizer(uniform_slog_mean, "log", "bin mean", False, ("top_edge", "zeros"), True),
    "binarization": Quantizer(binarization, "binary", "1/n", True, ("floor", "scope"), True),
}
