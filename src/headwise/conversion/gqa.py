"""``convert_gqa``: merge the key/value heads of decoder self-attention into fewer, shared ones.

Works in the "expanded" view: every query head reads one of today's key/value heads (its source); a new group of
query heads gets one merged key/value head (:mod:`.merge`). Groups whose members already read one source copy it,
so unchanged ``kv_heads`` with contiguous grouping is exact. Llama/Mistral/Qwen2 store the new head count in
``config.num_key_value_heads`` (a standard architecture, exported natively); BART/Marian record an edit that
``headwise.from_pretrained`` replays (their configs have no key/value head count).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
from torch import nn

from ..allocator import trim
from ..errors import HeadwiseError
from ..contract import record, with_keywords
from ..progress import progress_bar
from ..sites import AttentionSite, recorded_sites
from .calibration import moments_by_group
from .checks import check_calibration, convertible_sites, kv_heads_in_config
from .config import GQAConfig
from .grouping import balanced_groups, contiguous_groups, similarity
from .merge import Compensation, Merged, merge_group
from .weights import SiteWeights, linear_from_rows, rebind, rewritten

EDIT_KIND = "gqa_kv_heads"


def _check(model: nn.Module, config: GQAConfig) -> list[AttentionSite]:
    sites = convertible_sites(model, "convert_gqa")
    if config.grouping not in ("contiguous", "similarity"):
        raise HeadwiseError(f"grouping={config.grouping!r}; choose 'contiguous' or 'similarity'")
    if config.init not in ("mean", "svd", "calibrated"):
        raise HeadwiseError(f"init={config.init!r}; choose 'mean', 'svd' or 'calibrated'")
    kv = config.kv_heads
    if not kv_heads_in_config(model) and model.config._attn_implementation == "eager":
        raise HeadwiseError(f"{model.config.model_type}'s eager attention does not expand shared key/value heads; load "
                            "the model with attn_implementation='sdpa' (or call headwise.enable(model)) first")
    for site in sites:
        if not isinstance(kv, int) or isinstance(kv, bool) or kv < 1 or site.num_heads % kv:
            divisors = [n for n in range(1, site.num_heads + 1) if site.num_heads % n == 0]
            raise HeadwiseError(f"kv_heads={kv!r} does not divide the {site.num_heads} query heads of {site.name}; "
                                f"choose one of {divisors}")
    return sites


def _plan(weights: SiteWeights, site: AttentionSite, config: GQAConfig, sigma: torch.Tensor) -> list[Merged]:
    """One merged key/value head per group; the groups list their query heads in the new head order."""
    rotary = site.positions == "rotary"
    if config.grouping == "similarity":
        groups = balanced_groups(similarity(weights, sigma, rotary), config.kv_heads)
    else:
        groups = contiguous_groups(site.num_heads, config.kv_heads)
    fit_sigma = sigma if config.init == "calibrated" else torch.eye(sigma.shape[0], dtype=sigma.dtype)
    return [merge_group(weights, g, config.init, fit_sigma, rotary, config.ridge) for g in groups]


def kv_projections(site: AttentionSite, kv_heads: int, k_rows: torch.Tensor | None = None,
                   v_rows: torch.Tensor | None = None, bias: bool = False) -> tuple[nn.Linear, nn.Linear]:
    """New key and value projections of ``site`` for ``kv_heads`` heads, from ``[G·d, n]`` rows (or empty, for a
    replay); the site is left as it is."""
    out = []
    for name, rows in (("k_proj", k_rows), ("v_proj", v_rows)):
        old = getattr(site.module, name)
        if rows is None:
            rows = torch.zeros(kv_heads * site.head_dim, old.in_features + int(old.bias is not None))
            bias = old.bias is not None
        out.append(linear_from_rows(rows, bias, old))
    return out[0], out[1]


def resize_kv(site: AttentionSite, kv_heads: int, k: nn.Linear, v: nn.Linear) -> None:
    """Give ``site`` ``kv_heads`` key/value heads: the projections ``k`` and ``v`` and the module's group count."""
    attn = site.module
    attn.k_proj, attn.v_proj = k, v
    attn.num_key_value_groups = site.num_heads // kv_heads
    if hasattr(attn, "num_key_value_heads"):
        attn.num_key_value_heads = kv_heads


@dataclass
class _Fitted:
    """A site's fit: its new key/value projections and its groups' compensations (``[d, d]`` maps); the new query
    and output tensors are built when the site is changed (``_install``)."""

    k: nn.Linear
    v: nn.Linear
    groups: list[Compensation]


def _fit(weights: SiteWeights, site: AttentionSite, config: GQAConfig, sigma: torch.Tensor) -> _Fitted:
    merged = _plan(weights, site, config, sigma)
    k, v = kv_projections(site, len(merged), torch.cat([m.k for m in merged]), torch.cat([m.v for m in merged]),
                          weights.bias)
    return _Fitted(k, v, [m.compensation for m in merged])


@torch.no_grad()
def _install(site: AttentionSite, fitted: _Fitted) -> None:
    """Build ``site``'s new query and output tensors from today's and put the fit in place (the old tensors are
    left to whoever shares them)."""
    w = SiteWeights.of(site)
    q = torch.cat([g.query_rows(w) for g in fitted.groups])
    o = torch.cat([g.output_columns(w) for g in fitted.groups])
    rebind(site.q.module, *rewritten(site.q, q, w.bias))
    rebind(site.o.module, rewritten(site.o, o, w.bias)[0], None)  # the output bias is not per head: unchanged
    resize_kv(site, len(fitted.groups), fitted.k, fitted.v)


def convert_gqa(model: nn.Module, kv_heads: int | None = None, grouping: str | None = None, init: str | None = None,
                calibration: Iterable[dict | torch.Tensor] | None = None, config: GQAConfig | None = None,
                ridge: float | None = None, moments: dict[str, torch.Tensor] | None = None,
                progress: bool | None = None) -> nn.Module:
    """Convert every decoder self-attention of ``model`` to ``kv_heads`` key/value heads, in place.

    ``calibration``: input-id tensors ``[B, T]`` or model-input dicts (needed by ``init="calibrated"``; also used by
    ``grouping="similarity"``; read a group of sites at a time, ``input_moments_in_groups``), or ``moments``
    computed once with :func:`input_moments` (to try several options). Everything is validated and fitted before
    the model changes; a fit keeps each site's new key/value projections and ``[d, d]`` query/output maps, and each
    site's new tensors are built as it is changed, so the new q and o of every site never exist at once. Returns
    the model.
    """
    if config is None and kv_heads is None:
        raise HeadwiseError("convert_gqa needs kv_heads (key/value heads per layer after conversion) or a GQAConfig")
    config = with_keywords(GQAConfig, config, kv_heads=kv_heads, grouping=grouping, init=init, ridge=ridge)
    sites = _check(model, config)
    check_calibration(config.init, calibration if moments is None else moments, config.grouping)
    fitted = {}
    bar = progress_bar(total=len(sites), desc="fit kv heads", unit="layer",
                       disable=None if progress is None else not progress)
    for group, sigmas in moments_by_group(model, sites, calibration, moments, progress):
        for site in group:
            weights = SiteWeights.of(site)
            sigma = sigmas.pop(site.path, torch.eye(weights.q.shape[-1], dtype=torch.float64))
            fitted[site.path] = _fit(weights, site, config, sigma)
            bar.update()
    bar.close()
    trim()  # the fits' freed work goes back before the new tensors are built
    for site in sites:
        _install(site, fitted.pop(site.path))
    if kv_heads_in_config(model):
        model.config.num_key_value_heads = config.kv_heads
    state = {} if kv_heads_in_config(model) else {"kv_heads": {s.path: config.kv_heads for s in sites}}
    record(model, "gqa", config, state)
    return model


def replay_gqa(model: nn.Module, entry: dict) -> None:
    """Resize the key/value projections a journal entry lists (``state["kv_heads"]``: ``{site path: KV heads}``;
    empty for families whose config holds the KV head count, which the fresh model already has)."""
    kv_heads = entry["state"].get("kv_heads", {})
    sites = recorded_sites(model, kv_heads, f"edit {EDIT_KIND}")
    for path, kv in kv_heads.items():
        resize_kv(sites[path], int(kv), *kv_projections(sites[path], int(kv)))
