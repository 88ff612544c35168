"""Randomized attention, RA (Zheng et al., ICML 2022): an unbiased sampled estimate of softmax attention.

For each query, ``ω ~ Σ_m softmax_m(qᵀk_m) N(q + k_m, I)`` (pick a key by its softmax weight, add Gaussian noise;
queries and keys scaled by ``√scale``), then ``out = Σ_m softmax_m(ωᵀk_m − |k_m|²/2) v_m``; the expectation over
``ω`` is exactly softmax attention. Padded keys are excluded from both steps. O(T² d) like softmax: it is the
quadratic reference of LARA. Noise comes from a generator seeded by ``seed``; ``samples`` estimates are averaged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .base import Mechanism, MechanismConfig, keep_or_ones, neg_fill, positive, register
from .lara import seeded_normal


@dataclass
class RAConfig(MechanismConfig):
    samples: int = field(default=1, metadata={"help": "samples of ω per query (averaged)"})
    seed: int = field(default=0, metadata={"help": "seed of the samples"})

    def check(self) -> None:
        positive("samples", self.samples)


@register
class RA(Mechanism):
    """Per-query sampled randomized attention; O(T² d); not causal."""

    name = "ra"
    config_class = RAConfig
    complexity = "O(T² d)"
    can_be_causal = False

    def attend(self, q, k, v, keep, causal, scale):
        keep = keep_or_ones(keep, q)
        q, k = q * scale ** 0.5, k * scale ** 0.5
        masked = ~keep[:, None, None, :]
        fill = neg_fill(q.dtype)
        log_mix = (q @ k.transpose(-1, -2)).masked_fill(masked, fill).log_softmax(-1)  # [b, h, T, T]
        out = 0
        for s in range(self.config.samples):
            seed = self.config.seed * 1_000_003 + s
            u = torch.rand(log_mix.shape, generator=torch.Generator().manual_seed(seed)).to(q).clamp(1e-7, 1 - 1e-7)
            gumbel = -torch.log(-torch.log(u))
            pick = (log_mix + gumbel).argmax(-1)  # a key per query, by its softmax weight
            chosen = torch.gather(k, 2, pick[..., None].expand(*pick.shape, k.shape[-1]))
            omega = q + chosen + seeded_normal(q.shape, seed + 1, q)
            logits = omega @ k.transpose(-1, -2) - k.pow(2).sum(-1)[:, :, None, :] / 2
            out = out + logits.masked_fill(masked, fill).softmax(-1) @ v
        return out / self.config.samples
