"""Kernelised attention ``φ(q)ᵀ Σ φ(k) vᵀ / φ(q)ᵀ Σ φ(k)``: the shared engine of the feature-map mechanisms.

Non-causal: one ``[m, d]`` summary per head. Causal: chunks of ``CHUNK`` tokens, exact (masked) inside a chunk and
an exclusive prefix sum of chunk summaries across chunks, so time and memory stay linear and backward is cheap.
Decoding keeps the running sums ``S [B, H, m, d]`` and ``z [B, H, m]`` (float32 for half inputs) and, for
exponential features, the log-scale ``M [B, H, 1, 1]`` they are stored at (rescaled when a larger key arrives).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from einops import rearrange

from .base import Mechanism, State, keep_or_ones, pad_to

CHUNK = 64


class Features(NamedTuple):
    """``qf, kf [B, H, T, m]``; ``k_shift [B, H, 1, 1]`` or None: the true key features are ``kf · exp(k_shift)``
    (a per-head constant removed so the exponentials stay in range; it cancels in the ratio)."""

    qf: torch.Tensor
    kf: torch.Tensor
    k_shift: torch.Tensor | None = None


def exclusive_cumsum(x: torch.Tensor, dim: int, reverse: bool = False) -> torch.Tensor:
    """Sums of the entries strictly before (``reverse``: after) each index along ``dim``, with no subtraction (no
    cancellation when one entry dominates)."""
    x = x.flip(dim) if reverse else x
    out = torch.cat([torch.zeros_like(x.narrow(dim, 0, 1)), x.narrow(dim, 0, x.shape[dim] - 1).cumsum(dim)], dim)
    return out.flip(dim) if reverse else out


def linear_attention(qf: torch.Tensor, kf: torch.Tensor, v: torch.Tensor, causal: bool) -> tuple[torch.Tensor, ...]:
    """Numerator ``[B, H, T, d]`` and denominator ``[B, H, T]`` from features ``qf, kf [B, H, T, m]``
    (padded keys already zeroed)."""
    if not causal:
        kv = torch.einsum("bhtm,bhtd->bhmd", kf, v)
        return qf @ kv, (qf @ kf.sum(2)[..., None])[..., 0]
    t = qf.shape[2]
    c = min(CHUNK, t)
    qf_, kf_, v_ = (rearrange(pad_to(x, c, 2), "b h (n c) e -> b h n c e", c=c) for x in (qf, kf, v))
    intra = (qf_ @ kf_.transpose(-1, -2)).tril()
    kv = torch.einsum("bhncm,bhncd->bhnmd", kf_, v_)
    z = kf_.sum(3)
    num = intra @ v_ + qf_ @ exclusive_cumsum(kv, 2)
    den = intra.sum(-1) + torch.einsum("bhncm,bhnm->bhnc", qf_, exclusive_cumsum(z, 2))
    return (rearrange(num, "b h n c d -> b h (n c) d")[:, :, :t], rearrange(den, "b h n c -> b h (n c)")[:, :, :t])


class KernelMechanism(Mechanism):
    """Base of feature-map mechanisms: subclasses implement ``features(q, k, keep, causal, scale, start)``
    (``keep [B, T]`` bool, or None when nothing is padded; ``start``: position of the first token, for
    position-aware maps such as cosFormer)."""

    complexity = "O(T m d)"

    def features(self, q: torch.Tensor, k: torch.Tensor, keep: torch.Tensor, causal: bool, scale: float,
                 start: int = 0) -> Features:
        raise NotImplementedError

    def divide(self, num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
        """``num / den`` for non-negative features (a row with no visible key gives 0)."""
        return num / den.clamp_min(torch.finfo(den.dtype).tiny)[..., None]

    def attend(self, q, k, v, keep, causal, scale):
        qf, kf, _ = self.features(q, k, keep, causal, scale)
        if keep is not None:  # padded keys add nothing
            kf = kf * keep[:, None, :, None].to(kf.dtype)
        return self.divide(*linear_attention(qf, kf, v, causal))

    def decode(self, q, k, v, keep, state: State, scale):
        keep = keep_or_ones(keep, q)
        qf, kf, shift = self.features(q, k, keep, True, scale, start=state.get("seen", 0))
        state["seen"] = state.get("seen", 0) + q.shape[2]
        kf = kf * keep[:, None, :, None].to(kf.dtype)
        if shift is not None:  # bring the stored sums and the new keys to a common log-scale
            old = state.get("M", shift)
            new = torch.maximum(old, shift)
            kf = kf * (shift - new).exp()
            if "S" in state:
                state["S"], state["z"] = state["S"] * (old - new).exp(), state["z"] * (old - new)[..., 0].exp()
            state["M"] = new
        intra = (qf @ kf.transpose(-1, -2)).tril()
        num, den = intra @ v, intra.sum(-1)
        if "S" in state:
            num, den = num + qf @ state["S"], den + (qf @ state["z"][..., None])[..., 0]
            state["S"], state["z"] = state["S"] + kf.transpose(-1, -2) @ v, state["z"] + kf.sum(2)
        else:
            state["S"], state["z"] = kf.transpose(-1, -2) @ v, kf.sum(2)
        return self.divide(num, den)
