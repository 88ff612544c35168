"""Performer / FAVOR+ (Choromanski et al., 2021): positive orthogonal random features for the softmax kernel.

``φ(x) = exp(ωᵀx − |x|²/2 − c) / √m`` with ``x = q·√scale`` (or ``k·√scale``), so ``E[φ(q)ᵀφ(k)] ∝ exp(scale·qᵀk)``.
The stabilisers ``c`` cancel exactly in the ratio: per query its own maximum; for keys the maximum over the real
keys of the head (a constant common to every key, so causal outputs do not depend on it mathematically; decoding
keeps a running maximum and rescales its sums). Features are computed in float32 for half inputs (``compute_dtype``),
with no clamping and no epsilon inside them, so the estimate converges to softmax attention as ``features`` grows.
``learn_features=True`` makes ``ω`` a trained parameter (learnable random features), starting from the seed's draw.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .base import positive, register
from .features import RandomProjection
from .kernel import Features, KernelMechanism
from .randomness import RandomConfig


@dataclass
class PerformerConfig(RandomConfig):
    features: int = field(default=64, metadata={"help": "number of random features m"})
    learn_features: bool = field(default=False, metadata={"help": "train ω as a parameter (learnable random "
                                                                  "features; needs redraw=fixed)"})

    def check(self) -> None:
        super().check()
        positive("features", self.features)


def favor_features(q, k, keep, scale, omega) -> tuple[torch.Tensor, ...]:
    """Unnormalised FAVOR+ features of queries and keys, ``[B, H, T, m]`` each, and their stabilisers.

    ``qf = exp(ωᵀq' − c_q)`` (the per-query factor ``exp(−|q'|²/2)`` and ``1/m`` cancel in attention, so they are
    left out), ``kf = exp(ωᵀk' − |k'|²/2 − c_k)`` (0 for padded keys; ``keep`` None: none padded);
    ``c_q [B, H, T, 1]``, ``c_k [B, H, 1, 1]``.
    The softmax-kernel estimate is ``qf·kf · exp(c_q + c_k − |q'|²/2) / m``.
    """
    om = omega.to(q.dtype) * scale ** 0.5  # ωᵀ(x √scale) = (ω √scale)ᵀ x
    lq = torch.einsum("bhtd,hmd->bhtm", q, om)
    q_stab = lq.amax(-1, keepdim=True).detach()
    lk = torch.einsum("bhtd,hmd->bhtm", k, om) - k.pow(2).sum(-1, keepdim=True) * (scale / 2)
    if keep is not None:
        lk = lk.masked_fill(~keep[:, None, :, None], float("-inf"))
    k_stab = lk.amax(dim=(2, 3), keepdim=True).clamp_min(-1e4).detach()
    return (lq - q_stab).exp(), (lk - k_stab).exp(), q_stab, k_stab


@register
class Performer(KernelMechanism):
    """FAVOR+ with orthogonal positive random features; O(T m d)."""

    name = "performer"
    config_class = PerformerConfig

    def __init__(self, num_heads: int, head_dim: int, **args) -> None:
        super().__init__(num_heads, head_dim, **args)
        c = self.config
        self.projection = RandomProjection(num_heads, c.features, head_dim, c, learn=c.learn_features)

    def features(self, q, k, keep, causal, scale, start=0):
        qf, kf, _, k_stab = favor_features(q, k, keep, scale, self.projection.get(self.training))
        return Features(qf, kf, k_stab)
