"""Random feature attention (Peng et al., 2021): random Fourier features of unit-norm queries and keys.

With ``x̂ = x/|x|`` and ``ω ~ N(0, I/τ)``, ``E[cos ωᵀ(q̂ − k̂)] = exp(−|q̂ − k̂|²/2τ) ∝ exp(q̂ᵀk̂/τ)``, so RFA
estimates ``softmax(q̂ᵀk̂ / τ) v`` (cosine-similarity attention at temperature τ) with
``φ(x) = [sin ωᵀx̂, cos ωᵀx̂] / √m``. Trigonometric features can make the denominator tiny or negative for few
features; it is kept away from zero with its sign (``stabiliser``). Computed in float32 for half inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .base import positive, register
from .features import RandomProjection
from .kernel import Features, KernelMechanism
from .randomness import RandomConfig


@dataclass
class RFAConfig(RandomConfig):
    features: int = field(default=64, metadata={"help": "number of random frequencies m (2m features)"})
    temperature: float = field(default=1.0, metadata={"help": "τ: RFA approximates softmax(q̂·k̂ / τ)"})

    def check(self) -> None:
        super().check()
        positive("features", self.features)
        positive("temperature", self.temperature, 1e-6)


@register
class RFA(KernelMechanism):
    """Random Fourier features on normalised queries and keys; O(T m d)."""

    name = "rfa"
    config_class = RFAConfig

    def __init__(self, num_heads: int, head_dim: int, **args) -> None:
        super().__init__(num_heads, head_dim, **args)
        self.projection = RandomProjection(num_heads, self.config.features, head_dim, self.config)

    def features(self, q, k, keep, causal, scale, start=0):
        omega = self.projection.get(self.training).to(q.dtype) * self.config.temperature ** -0.5
        out = []
        for x in (q, k):
            proj = torch.einsum("bhtd,hmd->bhtm", F.normalize(x, dim=-1), omega)
            out.append(torch.cat([proj.sin(), proj.cos()], dim=-1) * omega.shape[1] ** -0.5)
        return Features(*out)

    def divide(self, num, den):
        eps = 1e-4
        safe = torch.where(den.abs() < eps, torch.full_like(den, eps), den)
        return num / safe[..., None]
