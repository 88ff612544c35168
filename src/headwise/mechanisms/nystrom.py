"""Nyströmformer (Xiong et al., 2021): softmax attention through ``m`` segment-mean landmarks.

``out = softmax(q k̃ᵀ) · pinv(softmax(q̃ k̃ᵀ)) · softmax(q̃ kᵀ) v`` with ``q̃, k̃`` the means of ``m`` equal segments
(over real tokens only) and the pseudo-inverse from Newton–Schulz iterations. Landmarks of fully padded segments
are dropped (identity rows in the small matrix), so padding never reaches real outputs. Not causal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from einops import rearrange

from .base import Mechanism, MechanismConfig, ceil_div, keep_or_ones, neg_fill, pad_to, positive, register


@dataclass
class NystromConfig(MechanismConfig):
    landmarks: int = field(default=64, metadata={"help": "number of landmarks m (segment means)"})
    pinv_iterations: int = field(default=6, metadata={"help": "Newton–Schulz iterations for the pseudo-inverse"})

    def check(self) -> None:
        positive("landmarks", self.landmarks)
        positive("pinv_iterations", self.pinv_iterations)


def segment_means(x: torch.Tensor, keep: torch.Tensor, segments: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked means of ``segments`` equal segments: ``x [B, H, T, d] -> [B, H, s, d]`` and validity ``[B, s]``."""
    size = ceil_div(x.shape[2], segments)
    w = rearrange(pad_to(keep.to(x.dtype), size, 1), "b (s l) -> b s l", l=size)
    xs = rearrange(pad_to(x, size, 2), "b h (s l) d -> b h s l d", l=size)
    count = w.sum(-1)
    means = torch.einsum("bhsld,bsl->bhsd", xs, w) / count.clamp_min(1)[:, None, :, None]
    return means, count > 0


def newton_schulz_pinv(a: torch.Tensor, iterations: int) -> torch.Tensor:
    """Iterative Moore–Penrose inverse of ``a [..., m, m]`` (initialised per matrix, as in Nyströmformer)."""
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    norm = a.abs().sum(-1).amax(-1) * a.abs().sum(-2).amax(-1)
    z = a.transpose(-1, -2) / norm[..., None, None]
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


@register
class Nystrom(Mechanism):
    """Nyström approximation with segment-mean landmarks; O(T m d + m³); not causal."""

    name = "nystrom"
    config_class = NystromConfig
    complexity = "O(T m d + m³)"
    can_be_causal = False

    def attend(self, q, k, v, keep, causal, scale):
        keep = keep_or_ones(keep, q)
        ql, valid = segment_means(q * scale, keep, min(self.config.landmarks, q.shape[2]))
        kl, _ = segment_means(k, keep, min(self.config.landmarks, q.shape[2]))
        m = ql.shape[2]  # ceil(T / size) segments: may be fewer than asked
        fill = neg_fill(q.dtype)
        f = (q * scale @ kl.transpose(-1, -2)).masked_fill(~valid[:, None, None, :], fill).softmax(-1)
        a = (ql @ kl.transpose(-1, -2)).masked_fill(~valid[:, None, None, :], fill).softmax(-1)
        off = ~(valid[:, :, None] & valid[:, None, :])[:, None]  # rows or columns of empty landmarks
        eye = torch.eye(m, dtype=q.dtype, device=q.device)
        a = torch.where(off, eye, a)
        b = (ql @ k.transpose(-1, -2)).masked_fill(~keep[:, None, None, :], fill).softmax(-1)
        bv = (b @ v) * valid[:, None, :, None]
        return f @ (newton_schulz_pinv(a, self.config.pinv_iterations) @ bv)
