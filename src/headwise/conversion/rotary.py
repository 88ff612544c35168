"""Rotary pairs as complex numbers, and the linear maps of keys that commute with the rotary embedding.

transformers' rotary embedding (``rotate_half`` layout) pairs dimension ``f`` with ``f + d/2`` and rotates each
pair by an angle ``θ_f·t``: in complex form ``z_f = x_f + i·x_{f+d/2}`` becomes ``z_f·e^{iθ_f t}``. A linear
map ``M`` of a key commutes with every such rotation (``R_t M = M R_t`` for all ``t``) exactly when it acts on each
pair as multiplication by a complex scalar ``c_f`` (a 2×2 rotation-scaling ``[[a, −b], [b, a]]``) and mixes no
pairs: rotations by distinct angles only commute with maps that keep their planes and commute with
rotations of the plane, which are the complex scalars. So a shared key ``k'`` and per-head scalars ``c`` give
``k ≈ c ⊙ k'`` before *and* after the rotary embedding, and ``c`` moves into the query: ``q·(c ⊙ k') =
(c̄ ⊙ q)·k'``.
"""

from __future__ import annotations

import torch
from einops import rearrange


def to_complex(rows: torch.Tensor) -> torch.Tensor:
    """``rows[..., d, n]`` (real, rotate-half layout) → ``[..., d/2, n]`` complex: row ``f`` + i·row ``f+d/2``."""
    pairs = rearrange(rows, "... (two f) n -> ... f n two", two=2).contiguous()
    return torch.view_as_complex(pairs)


def to_real(rows: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`to_complex`: ``[..., d/2, n]`` complex → ``[..., d, n]`` real."""
    return rearrange(torch.view_as_real(rows), "... f n two -> ... (two f) n")


def pair_scale(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Multiply every rotary pair of ``x[..., d]`` by the complex scalar ``c[d/2]`` (the maps that commute with
    the rotary embedding). Real arithmetic in ``x``'s dtype: ``[a, −b; b, a]`` on ``(x_f, x_{f+d/2})``."""
    x1, x2 = x.chunk(2, dim=-1)
    a, b = c.real.to(x.dtype), c.imag.to(x.dtype)
    return torch.cat([a * x1 - b * x2, b * x1 + a * x2], dim=-1)


def conjugate_rows(rows: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Projection rows ``[d, n]`` whose output is ``c̄ ⊙ (rows · x)`` per pair (the query compensation)."""
    return to_real(c.conj()[:, None] * to_complex(rows))
