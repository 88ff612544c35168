"""Scatterbrain (Chen et al., 2021): sparse + low-rank. Exact softmax weights for nearby keys, Performer (FAVOR+)
estimates for every other key.

``num_i = Σ_{j∉W(i)} φ(q_i)ᵀφ(k_j) v_j + Σ_{j∈W(i)} exp(s_ij) v_j`` (and the same without ``v`` for the
denominator). ``mode="block"`` (default, as the HKUNLP reference): ``W(i)`` is the block of ``window`` tokens of
``i`` (causal: up to ``i``); ``mode="sliding"``: ``W(i) = {|i − j| < window}`` (as ``local``). Two ways to compute
the same matrix, chosen by cost: the low-rank sum over every key minus its per-entry part inside ``W(i)``
(``O(T (w + m) d + T w m)``; sliding windows, non-causal blocks, causal blocks shorter than the kernel chunk), or,
for causal blocks of at least ``CHUNK`` tokens, the ``[m, d]`` low-rank summaries of the earlier blocks (an
exclusive prefix sum), which needs no ``T × w × m`` tensor. Per-block summaries of short blocks cost ``T m d / w``
memory traffic (with ``w = 4`` on MiniLM-sized inputs, an order of magnitude slower than the subtraction).
A sequence no longer than ``window`` is one block: exact attention (SDPA), no features.
Everything is kept relative to a per-query reference ``max(log-scale of the features, max_j s_ij)``, so no
exponential overflows; features and sums are float32 for half inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from einops import rearrange

from ..errors import HeadwiseError
from .base import Mechanism, ceil_div, keep_or_ones, pad_to, positive, register
from .features import RandomProjection
from .kernel import CHUNK, exclusive_cumsum, linear_attention
from .local import band
from .performer import favor_features
from .randomness import RandomConfig
from .softmax import sdpa


@dataclass
class ScatterbrainConfig(RandomConfig):
    window: int = field(default=64, metadata={"help": "block length (block mode) or sliding window attended exactly"})
    features: int = field(default=64, metadata={"help": "Performer random features for the rest"})
    mode: str = field(default="block", metadata={"help": "exact part: block (the reference's) or sliding window",
                                                 "choices": ("block", "sliding")})

    def check(self) -> None:
        super().check()
        positive("window", self.window)
        positive("features", self.features)
        if self.mode not in ("block", "sliding"):
            raise HeadwiseError(f"scatterbrain: mode must be 'block' or 'sliding', got {self.mode!r}")


@register
class Scatterbrain(Mechanism):
    """Local softmax (blocks or sliding windows) + Performer for the remainder; O(T (w + m) d)."""

    name = "scatterbrain"
    config_class = ScatterbrainConfig
    complexity = "O(T (w + m) d)"

    def __init__(self, num_heads: int, head_dim: int, **args) -> None:
        super().__init__(num_heads, head_dim, **args)
        c = self.config
        self.projection = RandomProjection(num_heads, c.features, head_dim, c)

    def attend(self, q, k, v, keep, causal, scale):
        omega = self.projection.get(self.training)
        t, w = q.shape[2], self.config.window
        if t <= w:  # one block (or window) holds every key: the low-rank part is empty and this is exact attention
            return sdpa(q, k, v, keep, causal, scale)
        qf, kf, q_stab, k_stab = favor_features(q, k, keep, scale, omega)
        if keep is not None:
            kf = kf * keep[:, None, :, None].to(kf.dtype)
        log_scale = q_stab + k_stab - q.pow(2).sum(-1, keepdim=True) * (scale / 2) - math.log(omega.shape[1])
        features = (qf, kf, log_scale)
        if self.config.mode == "sliding":
            _, inside = band(w, w, causal, q.device)
            return _corrected(q, k, v, keep, causal, scale, *features, w, w, 0 if causal else w, inside)
        if causal and w >= CHUNK:
            return _causal_blocks(q, k, v, keep_or_ones(keep, q), scale, *features, w)
        inside = torch.ones(w, w, dtype=torch.bool, device=q.device).tril() if causal else None
        return _corrected(q, k, v, keep, causal, scale, *features, w, 0, 0, inside)


def _causal_blocks(q, k, v, keep, scale, qf, kf, log_scale, w):
    """Causal blocks of ``w ≥ CHUNK`` tokens: exact inside the block up to the query, and the ``[m, d]`` low-rank
    summaries of the earlier blocks (an exclusive prefix sum over blocks), so nothing of size ``T × w × m``."""
    t = q.shape[2]
    blocks = lambda x: rearrange(pad_to(x, w, 2), "b h (n w) e -> b h n w e", w=w)  # noqa: E731
    qb, kb, vb, qfb, kfb = (blocks(x) for x in (q * scale, k, v, qf, kf))
    earlier_kv = exclusive_cumsum(torch.einsum("bhnwm,bhnwd->bhnmd", kfb, vb), 2)
    earlier_z = exclusive_cumsum(kfb.sum(3), 2)
    allowed = rearrange(pad_to(keep, w, 1), "b (n w) -> b n w", w=w)[:, None, :, None, :]
    allowed = allowed & torch.ones(w, w, dtype=torch.bool, device=q.device).tril()
    scores = (qb @ kb.transpose(-1, -2)).masked_fill(~allowed, -math.inf)  # [b, h, n, w, w]
    log_scale = blocks(log_scale)[..., 0]
    ref = torch.maximum(log_scale, scores.amax(-1)).detach()
    low = (log_scale - ref).exp()[..., None]
    weights = (scores - ref[..., None]).exp()
    num = weights @ vb + low * (qfb @ earlier_kv)
    den = weights.sum(-1) + low[..., 0] * torch.einsum("bhnwm,bhnm->bhnw", qfb, earlier_z)
    out = num / den.clamp_min(torch.finfo(den.dtype).tiny)[..., None]
    return rearrange(out, "b h n w d -> b h (n w) d")[:, :, :t]


def _corrected(q, k, v, keep, causal, scale, qf, kf, log_scale, w, left, right, inside):
    """The low-rank sum over every (causal: earlier) key, plus, for the keys ``inside`` the span of each query
    block (``left`` keys before the block of ``w`` queries, ``right`` after; ``inside [w, left + w + right]``, None:
    all of it), the exact weight minus what the low-rank sum counted: ``O(T (w + left + right) (d + m))``, no
    per-block summaries. ``keep`` None: no padded token."""
    t = q.shape[2]
    num_lr, den_lr = linear_attention(qf, kf, v, causal)
    n = ceil_div(t, w)
    kw, right = w + left + right, n * w - t + right
    blocks = lambda x: rearrange(pad_to(x, w, 2), "b h (n w) e -> b h n w e", w=w)  # noqa: E731
    if left == right == 0:  # disjoint blocks tiling the sequence: a block's key span is the block itself
        windows = lambda x: blocks(x).transpose(-1, -2)  # noqa: E731 - [b, h, n, e, w]
    else:
        windows = lambda x: F.pad(x, (0, 0, left, right)).unfold(2, kw, w)  # noqa: E731 - [b, h, n, e, kw] views
    allowed = inside
    if keep is not None or right or left:  # padded tokens, or the zeros padding the spans, are never attended
        span = F.pad(keep_or_ones(keep, q), (left, right)).unfold(1, kw, w)[:, None, :, None, :]  # [b, 1, n, 1, kw]
        allowed = span if inside is None else inside & span
    scores = torch.einsum("bhnqd,bhndk->bhnqk", blocks(q * scale), windows(k))
    approx = torch.einsum("bhnqm,bhnmk->bhnqk", blocks(qf), windows(kf))
    if allowed is not None:
        scores, approx = scores.masked_fill_(~allowed, -math.inf), approx.mul_(allowed)
    log_scale = blocks(log_scale)[..., 0]  # [b, h, n, w]
    ref = torch.maximum(log_scale, scores.amax(-1)).detach()
    low = (log_scale - ref).exp()[..., None]
    # inside the span: the exact weight minus what the low-rank sum already counted
    weights = (scores - ref[..., None]).exp_() - approx.mul_(low)
    num = blocks(num_lr) * low + torch.einsum("bhnqk,bhndk->bhnqd", weights, windows(v))
    den = blocks(den_lr[..., None])[..., 0] * low[..., 0] + weights.sum(-1)
    out = num / den.clamp_min(torch.finfo(den.dtype).tiny)[..., None]
    return rearrange(out, "b h n w d -> b h (n w) d")[:, :, :t]

