"""2D neighbourhood attention for image tokens, with optional global prefix tokens and relative position bias.

Tokens ``prefix_tokens .. T`` form a ``height × width`` grid (row-major, as ViT patches; a square grid is inferred
when ``grid`` is 0). Grid query ``(y, x)`` sees grid keys with ``|y - y'| < window`` and ``|x - x'| < window`` plus
every prefix token; prefix tokens (e.g. ``[CLS]``) see everything. The grid is cut into ``window × window``
blocks and each block scores its 3 × 3 neighbour blocks: O(T·w²) cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from ..errors import HeadwiseError
from .base import Mechanism, MechanismConfig, keep_or_ones, neg_fill, positive, register
from .softmax import sdpa


@dataclass
class Local2dConfig(MechanismConfig):
    window: int = field(default=7, metadata={"help": "neighbourhood half-size: |dy| < window and |dx| < window"})
    grid: int = field(default=0, metadata={"help": "grid width in tokens (0: square grid inferred from the length)"})
    prefix_tokens: int = field(default=0, metadata={"help": "leading global tokens, e.g. 1 for ViT's [CLS]"})
    rel_pos_bias: bool = field(default=False, metadata={"help": "learn a bias per head and 2D relative offset"})

    def check(self) -> None:
        positive("window", self.window)
        positive("grid", self.grid, 0)
        positive("prefix_tokens", self.prefix_tokens, 0)


def _offsets(w: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``dy, dx [w², 9w²]``: key minus query coordinates for a block against its 3 × 3 neighbour blocks."""
    a = torch.arange(w, device=device)
    qy, qx = a.repeat_interleave(w), a.repeat(w)  # query position inside its block
    s = torch.arange(-1, 2, device=device)
    ky = (s[:, None, None, None] * w + a[None, None, :, None]).expand(3, 3, w, w).reshape(-1)
    kx = (s[None, :, None, None] * w + a[None, None, None, :]).expand(3, 3, w, w).reshape(-1)
    return ky[None] - qy[:, None], kx[None] - qx[:, None]


def _neighbours(x: torch.Tensor) -> torch.Tensor:
    """``[b, h, ny, nx, w*w, e] -> [b, h, ny, nx, 9*w*w, e]`` (zero outside the grid)."""
    ny, nx = x.shape[2], x.shape[3]
    padded = F.pad(x, (0, 0, 0, 0, 1, 1, 1, 1))
    return torch.cat([padded[:, :, i:i + ny, j:j + nx] for i in range(3) for j in range(3)], dim=-2)


@register
class Local2d(Mechanism):
    """Exact softmax in a 2D neighbourhood of image tokens; not causal."""

    name = "local2d"
    config_class = Local2dConfig
    complexity = "O(T w² d)"
    can_be_causal = False

    def __init__(self, num_heads: int, head_dim: int, **args) -> None:
        super().__init__(num_heads, head_dim, **args)
        w = self.config.window
        self.bias = nn.Parameter(torch.zeros(num_heads, (2 * w - 1) ** 2)) if self.config.rel_pos_bias else None

    def _grid(self, n: int) -> tuple[int, int]:
        width = self.config.grid or math.isqrt(n)
        if width * (n // width) != n:
            raise HeadwiseError(
                f"local2d: {n} grid tokens do not form a {'square' if not self.config.grid else f'{width}-wide'} "
                f"grid; set grid= (width) and prefix_tokens= (leading global tokens)"
            )
        return n // width, width

    def attend(self, q, k, v, keep, causal, scale):
        b, h, t, d = q.shape
        p, w = self.config.prefix_tokens, self.config.window
        rows, cols = self._grid(t - p)
        keep = keep_or_ones(keep, q)
        grid_keep = keep[:, p:].to(q.dtype)[:, None, :, None]

        def blocks(x: torch.Tensor) -> torch.Tensor:  # [b, h, T-p, e] -> [b, h, ny, nx, w*w, e]
            x = rearrange(x, "b h (y x) e -> b h y x e", y=rows)
            x = F.pad(x, (0, 0, 0, -cols % w, 0, -rows % w))
            return rearrange(x, "b h (ny wy) (nx wx) e -> b h ny nx (wy wx) e", wy=w, wx=w)

        qb = blocks(q[:, :, p:] * scale)
        keys, values = _neighbours(blocks(k[:, :, p:])), _neighbours(blocks(v[:, :, p:]))
        key_ok = _neighbours(blocks(grid_keep.expand(b, 1, rows * cols, 1)))[..., 0].bool()  # [b, 1, ny, nx, 9w²]
        dy, dx = _offsets(w, q.device)
        inside = (dy.abs() < w) & (dx.abs() < w)
        scores = torch.einsum("bhyxqd,bhyxkd->bhyxqk", qb, keys)
        if self.bias is not None:
            index = ((dy.clamp(-w + 1, w - 1) + w - 1) * (2 * w - 1) + dx.clamp(-w + 1, w - 1) + w - 1)
            scores = scores + (self.bias[:, index] * inside)[:, None, None]
        scores = scores.masked_fill(~(inside & key_ok[..., None, :]), neg_fill(scores.dtype))
        if p:
            prefix_scores = torch.einsum("bhyxqd,bhkd->bhyxqk", qb, k[:, :, :p])
            prefix_ok = keep[:, None, None, None, None, :p]
            scores = torch.cat([scores, prefix_scores.masked_fill(~prefix_ok, neg_fill(scores.dtype))], dim=-1)
            values = torch.cat([values, v[:, :, None, None, :p].expand(*values.shape[:4], p, d)], dim=-2)
        out = torch.einsum("bhyxqk,bhyxkd->bhyxqd", scores.softmax(-1), values)
        out = rearrange(out, "b h ny nx (wy wx) e -> b h (ny wy) (nx wx) e", wy=w)[:, :, :rows, :cols]
        out = rearrange(out, "b h y x e -> b h (y x) e")
        if p:
            out = torch.cat([sdpa(q[:, :, :p], k, v, keep, False, scale), out], dim=2)
        return out
