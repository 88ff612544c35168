"""LARA (Zheng et al., ICML 2022): randomized attention made linear with multiple importance sampling.

Softmax attention is an expectation over ``ω`` of ``f(ω) = Σ_m ξ(ω, k_m) v_m / Σ_m ξ(ω, k_m)`` with positive
features ``ξ(ω, x) = exp(ωᵀx − |x|²/2)``. LARA draws one ``ω_c ~ N(μ_c, I)`` from each of ``C`` proposals centred at
``μ_c = q̃_c + k̃_c`` (segment means of scaled queries and keys, real tokens only) and combines them with the
balance heuristic. Written in log space this is a softmax over proposals:
``out(q) = Σ_c softmax_c(ω_cᵀq + a_c + log z_c) β_c`` with ``β_c = Σ_m softmax_m(ω_cᵀk_m − |k_m|²/2) v_m``,
``log z_c = logsumexp_m(ω_cᵀk_m − |k_m|²/2)`` and ``a_c = −|ω_c|²/2 − logsumexp_c'(−|ω_c − μ_c'|²/2)``.
Noise comes from a generator seeded by ``seed`` (deterministic); ``sample=False`` uses ``ω_c = μ_c``. Not causal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .base import Mechanism, MechanismConfig, keep_or_ones, neg_fill, positive, register
from .nystrom import segment_means


@dataclass
class LARAConfig(MechanismConfig):
    num_landmarks: int = field(default=64, metadata={"help": "number of proposals C (segment landmarks)"})
    sample: bool = field(default=True, metadata={"help": "draw ω_c ~ N(μ_c, I) (False: use the means)"})
    seed: int = field(default=0, metadata={"help": "seed of the proposal samples"})

    def check(self) -> None:
        positive("num_landmarks", self.num_landmarks)


def seeded_normal(shape: tuple[int, ...], seed: int, like: torch.Tensor) -> torch.Tensor:
    """Standard normal noise from a fixed seed (the same every call: outputs are deterministic)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator).to(like)


@register
class LARA(Mechanism):
    """Multiple-importance-sampled random-feature attention with adaptive proposals; O(T C d); not causal."""

    name = "lara"
    config_class = LARAConfig
    complexity = "O(T C d)"
    can_be_causal = False

    def attend(self, q, k, v, keep, causal, scale):
        keep = keep_or_ones(keep, q)
        q, k = q * scale ** 0.5, k * scale ** 0.5
        c = min(self.config.num_landmarks, q.shape[2])
        ql, valid = segment_means(q, keep, c)
        kl, _ = segment_means(k, keep, c)
        mu = ql + kl  # [b, h, C, d]
        omega = mu + seeded_normal(mu.shape, self.config.seed, mu) if self.config.sample else mu
        fill = neg_fill(q.dtype)
        ok = valid[:, None, None, :]  # proposals of segments with real tokens
        cross = -(omega[..., :, None, :] - mu[..., None, :, :]).pow(2).sum(-1) / 2  # [b, h, C, C']
        a = -omega.pow(2).sum(-1) / 2 - torch.logsumexp(cross.masked_fill(~ok, fill), -1)
        logits = omega @ k.transpose(-1, -2) - k.pow(2).sum(-1)[:, :, None, :] / 2  # [b, h, C, T]
        logits = logits.masked_fill(~keep[:, None, None, :], fill)
        beta = logits.softmax(-1) @ v
        scores = q @ omega.transpose(-1, -2) + (a + torch.logsumexp(logits, -1))[:, :, None, :]
        return scores.masked_fill(~ok, fill).softmax(-1) @ beta
