"""Sliding-window attention over a 1D sequence, blocked so that cost is O(T·w).

Non-causal: query ``i`` sees keys ``|i - j| < window``; causal: ``0 <= i - j < window``. The sequence is cut into
blocks of ``window`` tokens; each query block scores its own block and its neighbours (previous and, when not
causal, next) and a band mask keeps the exact window. Optional learned relative position bias per head.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from .base import Mechanism, MechanismConfig, State, keep_or_ones, neg_fill, pad_to, positive, register


@dataclass
class LocalConfig(MechanismConfig):
    window: int = field(default=128, metadata={"help": "tokens each query sees on each side (causal: before it, "
                                                       "itself included)"})
    rel_pos_bias: bool = field(default=False, metadata={"help": "learn a bias per head and relative offset"})

    def check(self) -> None:
        positive("window", self.window)


def band(window: int, block: int, causal: bool, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Relative offsets ``j - i`` ``[w, kw]`` of a query block against its neighbour keys, and the window mask."""
    rel = torch.arange(3 * block if not causal else 2 * block, device=device)[None, :] - block \
        - torch.arange(block, device=device)[:, None]
    inside = (rel <= 0) & (rel > -window) if causal else rel.abs() < window
    return rel, inside


@register
class Local(Mechanism):
    """Exact softmax inside a sliding window; O(T·w·d) time and memory."""

    name = "local"
    config_class = LocalConfig
    complexity = "O(T w d)"
    compute_dtype = None  # SDPA accumulates in float32 itself

    def __init__(self, num_heads: int, head_dim: int, **args) -> None:
        super().__init__(num_heads, head_dim, **args)
        w = self.config.window
        self.bias = nn.Parameter(torch.zeros(num_heads, 2 * w - 1)) if self.config.rel_pos_bias else None

    def _bias(self, rel: torch.Tensor, inside: torch.Tensor) -> torch.Tensor:
        """``[H, *rel.shape]`` bias of relative offsets (0 outside the window)."""
        w = self.config.window
        index = (rel.clamp(-(w - 1), w - 1) + w - 1).masked_fill(~inside, 0)
        return self.bias[:, index] * inside

    def attend(self, q, k, v, keep, causal, scale):
        b, h, t, d = q.shape
        w = min(self.config.window, t)  # a window as long as the sequence is one block
        keep = keep_or_ones(keep, q)
        n = -(-t // w)
        kw = 2 * w if causal else 3 * w

        def windows(x: torch.Tensor) -> torch.Tensor:  # [b, h, T, e] -> [(b n), h, kw, e]: overlapping views
            x = F.pad(x, (0, 0, w, n * w - t + (0 if causal else w)))
            return rearrange(x.unfold(2, kw, w), "b h n e k -> (b n) h k e")

        kk = F.pad(keep, (w, n * w - t + (0 if causal else w))).unfold(1, kw, w)  # [b, n, kw]
        rel, inside = band(self.config.window, w, causal, q.device)
        allowed = (inside & kk[:, :, None, :]) | (rel == 0)  # own position: no row is empty
        allowed = rearrange(allowed, "b n q k -> (b n) q k")[:, None]
        bias = self._bias(rel, inside)[None].to(q.dtype) if self.bias is not None else q.new_zeros(())
        mask = torch.where(allowed, bias, float("-inf"))  # additive: SDPA's CPU kernel is ~30% faster than with bool
        queries = rearrange(pad_to(q, w, 2), "b h (n w) d -> (b n) h w d", w=w)
        out = F.scaled_dot_product_attention(queries, windows(k), windows(v), attn_mask=mask, scale=scale)
        return rearrange(out, "(b n) h w d -> b h (n w) d", b=b)[:, :, :t]

    def decode(self, q, k, v, keep, state: State, scale):
        """Keeps the last ``window - 1`` keys and values: constant memory per step."""
        keep = keep_or_ones(keep, q)
        if "k" in state:
            k, v, keep_all = (torch.cat([state[n], x], dim=2 if n != "keep" else 1)
                              for n, x in (("k", k), ("v", v), ("keep", keep)))
        else:
            keep_all = keep
        t, total = q.shape[2], k.shape[2]
        rel = torch.arange(total, device=q.device)[None, :] - (total - t) - torch.arange(t, device=q.device)[:, None]
        inside = (rel <= 0) & (rel > -self.config.window)
        scores = (q.float() * scale) @ k.float().transpose(-1, -2)  # float32 softmax (SDPA's accumulation)
        if self.bias is not None:
            scores = scores + self._bias(rel, inside)[None]
        allowed = (inside & keep_all[:, None, None, :]) | (rel == 0)
        out = scores.masked_fill(~allowed, neg_fill(scores.dtype)).softmax(-1).to(v.dtype) @ v
        kept = self.config.window - 1
        state["k"], state["v"] = k[:, :, total - kept:], v[:, :, total - kept:]
        state["keep"] = keep_all[:, total - kept:]
        return out
