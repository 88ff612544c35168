"""``convert_latent``: decoder self-attention keys and values decoded from one low-rank latent per token.

Per site, with ``G`` key/value heads of width ``d`` and ``p`` rotary pairs kept per head: the ``2·G·p`` key rows
with the largest query×key energy (MHA2MLA's criterion) are read from ``x`` directly; the other key rows and all
value rows are decoded from a shared latent ``c = D x`` of width ``r``. ``D`` is the top subspace of the targets
on the input moments (reduced-rank regression): key rows weighted by the root energy of the queries that read them
(score error), value rows through the output projection (output error), each part scaled to unit total energy;
the decoders are least squares given ``D``. At ``r = 2·G·d − 2·G·p`` the latent spans every target: exact.

Why not transformers' DeepSeek-V3 (multi-head latent attention) classes: their latent goes through an RMSNorm
(``kv_a_layernorm``) before decoding, and their keys carry the rotary embedding only on one shared rope head while
the decoded part has none, so a converted Llama key (rotary on every dimension) is not expressible there without
changing the function. A latent model is saved with ``headwise.save_pretrained`` and reloaded with
``headwise.from_pretrained``; its ``generate()`` holds the latent per token (``LatentCache``, conversion/cache.py).
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from ..errors import HeadwiseError
from ..contract import record, with_keywords
from ..progress import progress_bar
from ..sites import AttentionSite, recorded_sites
from .cache import use_latent_cache
from .calibration import moments_by_group
from .checks import check_calibration, convertible_sites
from .config import LatentConfig
from .fit import regress, shared_rows
from .layer import LatentProjection
from .merge import energy
from .weights import SiteWeights, linear_from_rows

EDIT_KIND = "latent_kv"


def full_rank(site: AttentionSite) -> int:
    """Values a token caches today at ``site``: ``2·G·d``."""
    return 2 * site.num_kv_heads * site.head_dim


def _rank(site: AttentionSite, config: LatentConfig) -> int:
    rope_rows = 2 * site.num_kv_heads * config.rope_pairs
    if config.rank is not None:
        return config.rank
    return round(config.kv_budget * full_rank(site)) - rope_rows


def _check(model: nn.Module, config: LatentConfig) -> list[AttentionSite]:
    sites = convertible_sites(model, "convert_latent")
    if (config.kv_budget is None) == (config.rank is None):
        raise HeadwiseError("give exactly one of kv_budget (fraction of today's KV bytes, e.g. 0.5) or rank")
    if config.kv_budget is not None and not 0 < config.kv_budget <= 1:
        raise HeadwiseError(f"kv_budget={config.kv_budget!r} must be in (0, 1] (a fraction of today's KV bytes)")
    if config.init not in ("svd", "calibrated"):
        raise HeadwiseError(f"init={config.init!r}; choose 'svd' or 'calibrated'")
    for site in sites:
        rope_rows = 2 * site.num_kv_heads * config.rope_pairs
        if not 0 <= config.rope_pairs <= site.head_dim // 2 or (config.rope_pairs and site.positions != "rotary"):
            raise HeadwiseError(f"rope_pairs={config.rope_pairs} for {site.name} ({site.positions} positions, "
                                f"{site.head_dim // 2} rotary pairs per head): use 0..{site.head_dim // 2} on rotary models, 0 otherwise")
        rank, most = _rank(site, config), full_rank(site) - rope_rows
        if not isinstance(rank, int) or not 1 <= rank <= most:
            raise HeadwiseError(f"{site.name}: latent rank {rank} is outside 1..{most} (its {site.num_kv_heads} "
                                f"key/value heads of width {site.head_dim} minus {rope_rows} rotary rows); lower the "
                                "rank, raise kv_budget, or keep fewer rope_pairs")
    return sites


def _rope_rows(w: SiteWeights, sigma: torch.Tensor, pairs: int) -> torch.Tensor:
    """Indices (into ``G·d`` key rows) of the ``pairs`` rotary pairs per key/value head with the largest
    ``‖q_f‖·‖k_f‖`` (query energy summed over the heads that read the key)."""
    heads, d = w.k.shape[0], w.k.shape[1]
    per_pair = lambda e: e[:, : d // 2] + e[:, d // 2:]  # noqa: E731
    q_energy = energy(w.q, sigma).unflatten(0, (heads, w.group)).sum(1)  # [G, d]
    score = (per_pair(q_energy) * per_pair(energy(w.k, sigma))).sqrt()
    top = score.topk(pairs, dim=1).indices.sort(dim=1).values  # [G, pairs]
    rows = torch.cat([top, top + d // 2], 1) + torch.arange(heads)[:, None] * d
    return rows.flatten().sort().values


def _fit(site: AttentionSite, config: LatentConfig, sigma: torch.Tensor) -> dict:
    w = SiteWeights.of(site)
    heads, d = w.k.shape[0], w.k.shape[1]
    keys, values = w.k.flatten(0, 1), w.v.flatten(0, 1)  # [G·d, n]
    rope = _rope_rows(w, sigma, config.rope_pairs) if config.rope_pairs else torch.zeros(0, dtype=torch.long)
    nope = torch.tensor([i for i in range(heads * d) if i not in set(rope.tolist())], dtype=torch.long)
    q_energy = energy(w.q, sigma).unflatten(0, (heads, w.group)).sum(1)  # [G, d]
    pair = q_energy[:, : d // 2] + q_energy[:, d // 2:]
    key_weight = (torch.cat([pair, pair], 1) if site.positions == "rotary" else q_energy).clamp(min=0).sqrt().flatten()
    key_part = key_weight[nope, None] * keys[nope]
    value_part = (w.o @ w.v[[w.source(h) for h in range(w.q.shape[0])]]).flatten(0, 1)
    scale = lambda rows: rows / energy(rows[None], sigma).sum().clamp(min=1e-30).sqrt()  # noqa: E731
    down = shared_rows(torch.cat([scale(key_part), scale(value_part)]), sigma, _rank(site, config), config.ridge)
    return {"down": down, "up_k": regress(keys[nope], down, sigma, config.ridge),
            "up_v": regress(values, down, sigma, config.ridge), "rope": keys[rope], "rope_index": rope,
            "nope_index": nope, "bias": w.bias}


def _order(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """Inverse permutation of ``cat(first, second)``."""
    cat = torch.cat([first, second])
    return torch.empty_like(cat).scatter_(0, cat, torch.arange(cat.numel()))


def projections(site: AttentionSite, fit: dict) -> tuple[LatentProjection, LatentProjection]:
    """``site``'s latent k/v projections built from ``fit`` (rows in float64, or zeros), in the weights' dtype; the
    site is left as it is."""
    bias = fit["bias"]
    like = site.module.k_proj
    down = linear_from_rows(fit["down"], bias, like)
    up_k = linear_from_rows(fit["up_k"], False, like)
    up_v = linear_from_rows(fit["up_v"], False, like)
    rope = linear_from_rows(fit["rope"], bias, like) if fit["rope_index"].numel() else None
    order_k = _order(fit["rope_index"], fit["nope_index"]).to(like.weight.device)
    values = fit["up_v"].shape[0]
    return (LatentProjection(down, up_k, rope, order_k),
            LatentProjection(down, up_v, None, torch.arange(values, device=like.weight.device)))


def install(site: AttentionSite, k: LatentProjection, v: LatentProjection) -> None:
    """Replace ``site``'s k/v projections by latent ones."""
    site.module.k_proj, site.module.v_proj = k, v


def convert_latent(model: nn.Module, kv_budget: float | None = None, rank: int | None = None,
                   rope_pairs: int | None = None, init: str | None = None,
                   calibration: Iterable[dict | torch.Tensor] | None = None,
                   config: LatentConfig | None = None, ridge: float | None = None,
                   moments: dict[str, torch.Tensor] | None = None, progress: bool | None = None) -> nn.Module:
    """Give every decoder self-attention of ``model`` a low-rank latent key/value path, in place (see module doc).

    ``kv_budget``: fraction of today's cached values per token (``rank = budget·2·G·d − 2·G·rope_pairs``), or
    ``rank`` directly. Validated and fitted before the model changes (the calibration read a group of sites at a
    time, each site's projections built as it is fitted); recorded for ``headwise.from_pretrained``."""
    config = with_keywords(LatentConfig, config, kv_budget=kv_budget, rank=rank, rope_pairs=rope_pairs, init=init,
                           ridge=ridge)
    sites = _check(model, config)
    check_calibration(config.init, calibration if moments is None else moments)
    built = {}
    bar = progress_bar(total=len(sites), desc="fit latent kv", unit="layer",
                       disable=None if progress is None else not progress)
    for group, sigmas in moments_by_group(model, sites, calibration, moments, progress):
        for site in group:
            n = site.hidden_size + int(site.k.module.bias is not None)
            built[site.path] = projections(site, _fit(site, config, sigmas.pop(site.path,
                                                                               torch.eye(n, dtype=torch.float64))))
            bar.update()
    bar.close()
    for site in sites:
        install(site, *built[site.path])
    record(model, "latent", config, {"sites": {
        s.path: {"rank": built[s.path][0].rank, "rope_rows": built[s.path][0].rope_rows} for s in sites}})
    use_latent_cache(model)
    return model


def replay_latent(model: nn.Module, entry: dict) -> None:
    """Install latent K/V layers of the ranks a journal entry lists (``state["sites"]``: ``{site path: {"rank",
    "rope_rows"}}``; the weights load afterwards)."""
    specs = entry["state"]["sites"]
    sites = recorded_sites(model, specs, f"edit {EDIT_KIND}")
    for path, spec in specs.items():
        site = sites[path]
        n = site.hidden_size + int(site.k.module.bias is not None)
        rows = site.num_kv_heads * site.head_dim
        rope_rows, rank = int(spec["rope_rows"]), int(spec["rank"])
        install(site, *projections(site, {
            "down": torch.zeros(rank, n), "up_k": torch.zeros(rows - rope_rows, rank), "up_v": torch.zeros(rows, rank),
            "rope": torch.zeros(rope_rows, n), "rope_index": torch.arange(rope_rows),
            "nope_index": torch.arange(rope_rows, rows), "bias": site.k.module.bias is not None}))
    use_latent_cache(model)
