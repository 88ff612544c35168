"""Performer / FAVOR+ (Choromanski et al., 2021): positive orthogonal random features for the softmax kernel.

``φ(x) = exp(ωᵀx − |x|²/2 − c) / √m`` with ``x = q·√scale`` (or ``k·√scale``), so ``E[φ(q)ᵀφ(k)] ∝ exp(scale·qᵀk)``.
The stabilisers ``c`` cancel exactly in the ratio: per query its own maximum; for keys the maximum over real keys
(non-causal) or the data-independent bound ``max|ω|²/2`` (causal, so the future never leaks in, and no overflow:
``ωᵀx − |x|²/2 ≤ |ω|²/2``). No clamping and no epsilon inside the features, so the estimate converges to softmax
attention as ``features`` grows; padded keys are zeroed and excluded from the stabiliser.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .base import MechanismConfig, positive, register
from .features import RandomProjection
from .kernel import KernelMechanism


@dataclass
class PerformerConfig(MechanismConfig):
    features: int = field(default=64, metadata={"help": "number of random features m"})
    redraw_interval: int = field(default=0, metadata={"help": "redraw the features every N training forwards "
                                                                "(0: never)"})
    seed: int = field(default=0, metadata={"help": "seed of the random features"})

    def check(self) -> None:
        positive("features", self.features)
        positive("redraw_interval", self.redraw_interval, 0)


def favor_features(q, k, keep, causal, scale, omega) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unnormalised FAVOR+ features of queries and keys, ``[B, H, T, m]`` each, and ``[B, H, T, 1]`` offsets.

    ``qf = exp(ωᵀq' − c_q)`` (the per-query factor ``exp(−|q'|²/2)`` and ``1/m`` cancel in attention, so they are
    left out), ``kf = exp(ωᵀk' − |k'|²/2 − c_k)`` (0 for padded keys). The softmax-kernel estimate is
    ``qf·kf · exp(offset − |q'|²/2) / m`` with ``offset = c_q + c_k``.
    """
    om = omega * scale ** 0.5  # ωᵀ(x √scale) = (ω √scale)ᵀ x
    lq = torch.einsum("bhtd,hmd->bhtm", q, om)
    q_stab = lq.amax(-1, keepdim=True).detach()
    lk = torch.einsum("bhtd,hmd->bhtm", k, om) - k.pow(2).sum(-1, keepdim=True) * (scale / 2)
    lk = lk.masked_fill(~keep[:, None, :, None], float("-inf"))
    if causal:
        k_stab = omega.pow(2).sum(-1).amax() / 2  # bound on ωᵀx − |x|²/2 (data independent)
    else:
        k_stab = lk.amax(dim=(2, 3), keepdim=True).clamp_min(-1e4).detach()
    return (lq - q_stab).exp_(), (lk - k_stab).exp_(), q_stab + k_stab


@register
class Performer(KernelMechanism):
    """FAVOR+ with orthogonal positive random features; O(T m d)."""

    name = "performer"
    config_class = PerformerConfig

    def __init__(self, num_heads: int, head_dim: int, **args) -> None:
        super().__init__(num_heads, head_dim, **args)
        c = self.config
        self.projection = RandomProjection(num_heads, c.features, head_dim, c.seed, c.redraw_interval)

    def features(self, q, k, keep, causal, scale):
        qf, kf, _ = favor_features(q, k, keep, causal, scale, self.projection.get(self.training).to(q.dtype))
        return qf, kf
