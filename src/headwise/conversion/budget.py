"""Key/value cache size per token, as a converted model would cache it."""

from __future__ import annotations

from torch import nn

from ..sites import find_sites
from .layer import LatentProjection


def kv_values_per_token(model: nn.Module) -> int:
    """Values cached per token over every decoder self-attention: ``2·G·d`` per layer, or for a latent site its
    rank plus its rotary rows (what ``LatentCache``, the cache ``generate`` uses on a latent model, holds)."""
    total = 0
    for site in find_sites(model):
        if site.kind != "dec-self":
            continue
        k = site.module.k_proj if hasattr(site.module, "k_proj") else None
        if isinstance(k, LatentProjection):
            total += k.rank + k.rope_rows
        else:
            total += 2 * site.num_kv_heads * site.head_dim
    return total


def kv_cache_bytes(model: nn.Module, bytes_per_value: int = 2) -> int:
    """Bytes per token of the key/value cache (``bytes_per_value=2`` for fp16/bf16)."""
    return kv_values_per_token(model) * bytes_per_value
