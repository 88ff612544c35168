"""Scatterbrain (Chen et al., 2021): sparse + low-rank. Exact softmax weights inside a sliding window, Performer
(FAVOR+) estimates for every other key.

``num_i = Σ_{j∉W(i)} φ(q_i)ᵀφ(k_j) v_j + Σ_{j∈W(i)} exp(s_ij) v_j`` (and the same without ``v`` for the
denominator), computed as the full low-rank sum minus its window part plus the exact window part. Everything is
kept relative to a per-query reference ``max(log-scale of the features, max_j s_ij)``, so no exponential overflows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from einops import rearrange

from .base import Mechanism, keep_or_ones, pad_to, positive, register
from .features import RandomProjection
from .kernel import linear_attention
from .local import band
from .performer import favor_features
from .randomness import RandomConfig


@dataclass
class ScatterbrainConfig(RandomConfig):
    window: int = field(default=64, metadata={"help": "sliding window attended exactly (as in local)"})
    features: int = field(default=64, metadata={"help": "Performer random features for the rest"})

    def check(self) -> None:
        super().check()
        positive("window", self.window)
        positive("features", self.features)


@register
class Scatterbrain(Mechanism):
    """Sliding-window softmax + Performer for the remainder; O(T (w + m) d)."""

    name = "scatterbrain"
    config_class = ScatterbrainConfig
    complexity = "O(T (w + m) d)"

    def __init__(self, num_heads: int, head_dim: int, **args) -> None:
        super().__init__(num_heads, head_dim, **args)
        c = self.config
        self.projection = RandomProjection(num_heads, c.features, head_dim, c)

    def attend(self, q, k, v, keep, causal, scale):
        t = q.shape[2]
        keep = keep_or_ones(keep, q)
        omega = self.projection.get(self.training)
        qf, kf, q_stab, k_stab = favor_features(q, k, keep, scale, omega)
        log_scale = q_stab + k_stab - q.pow(2).sum(-1, keepdim=True) * (scale / 2) - math.log(omega.shape[1])
        num_lr, den_lr = linear_attention(qf, kf, v, causal)

        w = min(self.config.window, t)
        n = -(-t // w)
        kw = 2 * w if causal else 3 * w
        right = n * w - t + (0 if causal else w)
        windows = lambda x: F.pad(x, (0, 0, w, right)).unfold(2, kw, w)  # noqa: E731 - [b, h, n, e, kw] views
        blocks = lambda x: rearrange(pad_to(x, w, 2), "b h (n w) e -> b h n w e", w=w)  # noqa: E731
        _, inside = band(self.config.window, w, causal, q.device)
        allowed = inside & F.pad(keep, (w, right)).unfold(1, kw, w)[:, None, :, None, :]  # [b, 1, n, w, kw]
        scores = torch.einsum("bhnqd,bhndk->bhnqk", blocks(q * scale), windows(k)).masked_fill_(~allowed, -math.inf)
        approx = torch.einsum("bhnqm,bhnmk->bhnqk", blocks(qf), windows(kf)).mul_(allowed)

        log_scale = blocks(log_scale)[..., 0]  # [b, h, n, w]
        ref = torch.maximum(log_scale, scores.amax(-1)).detach()
        low = (log_scale - ref).exp()[..., None]
        # window part: the exact weight minus what the low-rank sum already counted
        weights = (scores - ref[..., None]).exp_() - approx.mul_(low)
        num = blocks(num_lr) * low + torch.einsum("bhnqk,bhndk->bhnqd", weights, windows(v))
        den = blocks(den_lr[..., None])[..., 0] * low[..., 0] + weights.sum(-1)
        out = num / den.clamp_min(torch.finfo(den.dtype).tiny)[..., None]
        return rearrange(out, "b h n w d -> b h (n w) d")[:, :, :t]
