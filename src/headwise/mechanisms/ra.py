"""Randomized attention, RA (Zheng et al., ICML 2022): an unbiased sampled estimate of softmax attention.

For each query, ``ω ~ Σ_m softmax_m(qᵀk_m) N(q + k_m, I)`` (pick a key by its softmax weight, add Gaussian noise;
queries and keys scaled by ``√scale``), then ``out = Σ_m softmax_m(ωᵀk_m − |k_m|²/2) v_m``; the expectation over
``ω`` is exactly softmax attention. Padded keys are excluded from both steps. O(T² d) like softmax: it is the
quadratic reference of LARA. The key is picked by inverse CDF (one uniform per query, no ``[B, H, T, T]`` noise);
samples come from a generator on the input's device, fresh at every training forward by default (``redraw``) and
the same in evaluation; ``samples`` estimates are averaged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .base import Mechanism, keep_or_ones, neg_fill, positive, register
from .randomness import POLICIES, Draws, RandomConfig


@dataclass
class RAConfig(RandomConfig):
    redraw: str = field(default="every_step", metadata={"help": "when training draws fresh samples (evaluation "
                                                                "reuses the latest draw)", "choices": POLICIES})
    samples: int = field(default=1, metadata={"help": "samples of ω per query (averaged)"})

    def check(self) -> None:
        super().check()
        positive("samples", self.samples)


@register
class RA(Mechanism):
    """Per-query sampled randomized attention; O(T² d); not causal."""

    name = "ra"
    config_class = RAConfig
    complexity = "O(T² d)"
    can_be_causal = False

    def __init__(self, num_heads: int, head_dim: int, **args) -> None:
        super().__init__(num_heads, head_dim, **args)
        self.draws = Draws(self.config)

    def attend(self, q, k, v, keep, causal, scale):
        keep = keep_or_ones(keep, q)
        self.draws.step(self.training)
        gen = self.draws.generator(q.device)
        q, k = q * scale ** 0.5, k * scale ** 0.5
        masked = ~keep[:, None, None, :]
        fill = neg_fill(q.dtype)
        cdf = (q @ k.transpose(-1, -2)).masked_fill(masked, fill).softmax(-1).cumsum(-1)  # [b, h, T, T]
        out = 0
        for _ in range(self.config.samples):
            u = torch.rand(*q.shape[:-1], 1, generator=gen, device=q.device, dtype=q.dtype) * cdf[..., -1:]
            pick = (cdf < u).sum(-1).clamp_max(k.shape[2] - 1)  # a key per query, by its softmax weight
            chosen = torch.gather(k, 2, pick[..., None].expand(*pick.shape, k.shape[-1]))
            omega = q + chosen + torch.randn(q.shape, generator=gen, device=q.device, dtype=q.dtype)
            logits = omega @ k.transpose(-1, -2) - k.pow(2).sum(-1)[:, :, None, :] / 2
            out = out + logits.masked_fill(masked, fill).softmax(-1) @ v
        return out / self.config.samples
