"""Which query heads share a key/value head after conversion.

Heads are compared through the keys and values they read (``SiteWeights.source``), on the input moments
``Σ``: two heads are alike when one shared key and value explain both. Groups are balanced (``H / kv_heads``
heads each) and found greedily, in a way that depends on the weights only, not on the head order.
"""

from __future__ import annotations

import torch

from .rotary import to_complex
from .weights import SiteWeights


def _overlap(a: torch.Tensor, b: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """Subspace overlap ``‖A Σ Bᵀ‖² / (‖A Σ Aᵀ‖ ‖B Σ Bᵀ‖)`` of row blocks ``[d, n]`` (1 for the same block)."""
    return (a @ sigma @ b.mT).square().sum() / ((a @ sigma @ a.mT).norm() * (b @ sigma @ b.mT).norm())


def _pair_coherence(a: torch.Tensor, b: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """Mean over rotary pairs of ``|⟨z_a, z_b⟩|² / (‖z_a‖² ‖z_b‖²)`` (1 when one is a complex multiple of the other)."""
    za, zb, s = to_complex(a), to_complex(b), sigma.to(torch.complex128)
    dot = lambda x, y: torch.einsum("fn,nk,fk->f", x.conj(), s, y)  # noqa: E731
    return (dot(za, zb).abs().square() / (dot(za, za).real * dot(zb, zb).real)).mean()


def similarity(weights: SiteWeights, sigma: torch.Tensor, rotary: bool) -> torch.Tensor:
    """``[H, H]``: key alikeness (per-pair coherence when rotary) + value overlap of the heads' sources."""
    heads, kv = weights.q.shape[0], weights.k.shape[0]
    key_sim = torch.empty(kv, kv, dtype=torch.float64)
    value_sim = torch.empty(kv, kv, dtype=torch.float64)
    for i in range(kv):
        for j in range(kv):
            ka, kb = weights.k[i], weights.k[j]
            key_sim[i, j] = _pair_coherence(ka, kb, sigma) if rotary else _overlap(ka, kb, sigma)
            value_sim[i, j] = _overlap(weights.v[i], weights.v[j], sigma)
    source = torch.tensor([weights.source(h) for h in range(heads)])
    return (key_sim + value_sim)[source][:, source]


def balanced_groups(sim: torch.Tensor, groups: int) -> list[list[int]]:
    """Split heads into ``groups`` groups of equal size: repeatedly seed with the free head most alike to the
    other free heads and add its most alike free heads. Groups sorted by their first head."""
    size = sim.shape[0] // groups
    free = list(range(sim.shape[0]))
    found = []
    while free:
        sub = sim[free][:, free]
        seed = free[int(sub.sum(1).argmax())]
        ranked = sorted((h for h in free if h != seed), key=lambda h: -float(sim[seed, h]))
        group = sorted([seed, *ranked[: size - 1]])
        found.append(group)
        free = [h for h in free if h not in group]
    return sorted(found)


def contiguous_groups(heads: int, groups: int) -> list[list[int]]:
    size = heads // groups
    return [list(range(j * size, (j + 1) * size)) for j in range(groups)]
