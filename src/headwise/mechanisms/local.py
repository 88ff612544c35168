"""Local attention over a 1D sequence, blocked so that cost is O(T·w): sliding windows or blocks.

``mode="sliding"`` (default): query ``i`` sees keys ``|i - j| < window`` (causal: ``0 <= i - j < window``).
``mode="block"`` (the HKUNLP reference's local attention): the sequence is cut into blocks of ``window`` tokens and
a query sees its own block plus ``overlap`` tokens on each side (causal: the ``overlap`` tokens before the block and
its block up to itself). Both run as one SDPA call over query blocks against an unfolded key span (views, no copy of
the keys per block) with a band mask; blocks cost ``window (1 + 2·overlap/window)`` scores per query, sliding
windows about ``2.5·window``. Optional learned relative position bias per head and offset.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from ..errors import HeadwiseError
from .base import Mechanism, MechanismConfig, State, ceil_div, keep_or_ones, neg_fill, pad_to, positive, register

MODES = ("sliding", "block")


@dataclass
class LocalConfig(MechanismConfig):
    window: int = field(default=128, metadata={"help": "sliding: tokens each query sees on each side (causal: before "
                                                       "it, itself included); block: the block length"})
    mode: str = field(default="sliding", metadata={"help": "sliding windows or blocks", "choices": MODES})
    overlap: int = field(default=0, metadata={"help": "block mode: extra tokens each block sees on each side"})
    rel_pos_bias: bool = field(default=False, metadata={"help": "learn a bias per head and relative offset"})

    def check(self) -> None:
        positive("window", self.window)
        positive("overlap", self.overlap, 0)
        if self.mode not in MODES:
            raise HeadwiseError(f"local: mode must be 'sliding' or 'block', got {self.mode!r}")
        if self.overlap and self.mode != "block":
            raise HeadwiseError("local: overlap applies to mode='block' only")

    @property
    def reach(self) -> int:
        """Largest ``|i - j|`` a query may see, plus one."""
        return self.window if self.mode == "sliding" else self.window + self.overlap


def band(window: int, block: int, causal: bool, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Sliding windows: relative offsets ``j - i`` ``[w, kw]`` of a query block against its neighbour keys
    (the previous block, its own and, unless causal, the next) and the window mask."""
    rel = torch.arange(3 * block if not causal else 2 * block, device=device)[None, :] - block \
        - torch.arange(block, device=device)[:, None]
    inside = (rel <= 0) & (rel > -window) if causal else rel.abs() < window
    return rel, inside


@register
class Local(Mechanism):
    """Exact softmax inside sliding windows or (overlapping) blocks; O(T·w·d) time and memory."""

    name = "local"
    config_class = LocalConfig
    complexity = "O(T w d)"
    compute_dtype = None  # SDPA accumulates in float32 itself

    def __init__(self, num_heads: int, head_dim: int, **args) -> None:
        super().__init__(num_heads, head_dim, **args)
        r = self.config.reach
        self.bias = nn.Parameter(torch.zeros(num_heads, 2 * r - 1)) if self.config.rel_pos_bias else None

    def _bias(self, rel: torch.Tensor, inside: torch.Tensor) -> torch.Tensor:
        """``[H, *rel.shape]`` bias of relative offsets (0 outside the window)."""
        r = self.config.reach
        index = (rel.clamp(-(r - 1), r - 1) + r - 1).masked_fill(~inside, 0)
        return self.bias[:, index] * inside

    def _span(self, t: int, causal: bool, device: torch.device
              ) -> tuple[int, int, int, torch.Tensor, torch.Tensor]:
        """Query block length, keys before / after each block, relative offsets ``j - i`` ``[block, kw]`` and the
        allowed mask. Sliding windows use blocks of ``window / 2`` (``window`` below 64 tokens) and a key span of
        ``block + 2 (window - 1)``: 2.5 windows of scores per query, where blocks of ``window`` would need 3."""
        cfg = self.config
        if cfg.mode == "sliding":
            block = min(t, cfg.window // 2 if cfg.window >= 64 else cfg.window)
            n = ceil_div(t, block)
            left = min(cfg.window - 1, (n - 1) * block)
            right = 0 if causal else left
        else:
            block, left = min(t, cfg.window), cfg.overlap
            right = 0 if causal else left
        rel = torch.arange(block + left + right, device=device)[None, :] - left \
            - torch.arange(block, device=device)[:, None]
        if cfg.mode == "sliding":
            inside = (rel <= 0) & (rel > -cfg.window) if causal else rel.abs() < cfg.window
        else:
            inside = rel <= 0 if causal else torch.ones_like(rel, dtype=torch.bool)
        return block, left, right, rel, inside

    def attend(self, q, k, v, keep, causal, scale):
        b, h, t, d = q.shape
        w, left, right, rel, inside = self._span(t, causal, q.device)
        n = ceil_div(t, w)
        kw = w + left + right
        if keep is None and self.bias is None and kw == w and t % w == 0:  # disjoint full blocks: nothing to mask
            blocks = [rearrange(x, "b h (n w) e -> (b n) h w e", w=w) for x in (q, k, v)]
            out = F.scaled_dot_product_attention(*blocks, is_causal=causal, scale=scale)
            return rearrange(out, "(b n) h w e -> b h (n w) e", b=b)
        keep = keep_or_ones(keep, q)

        def windows(x: torch.Tensor) -> torch.Tensor:  # [b, h, T, e] -> [(b n), h, kw, e]: overlapping views
            x = F.pad(x, (0, 0, left, n * w - t + right))
            return rearrange(x.unfold(2, kw, w), "b h n e k -> (b n) h k e")

        kk = F.pad(keep, (left, n * w - t + right)).unfold(1, kw, w)  # [b, n, kw]
        allowed = (inside & kk[:, :, None, :]) | (rel == 0)  # own position: no row is empty
        allowed = rearrange(allowed, "b n q k -> (b n) q k")[:, None]
        bias = self._bias(rel, inside)[None].to(q.dtype) if self.bias is not None else q.new_zeros(())
        mask = torch.where(allowed, bias, float("-inf"))  # additive: SDPA's CPU kernel is ~30% faster than with bool
        queries = rearrange(pad_to(q, w, 2), "b h (n w) d -> (b n) h w d", w=w)
        out = F.scaled_dot_product_attention(queries, windows(k), windows(v), attn_mask=mask, scale=scale)
        return rearrange(out, "(b n) h w d -> b h (n w) d", b=b)[:, :, :t]

    def decode(self, q, k, v, keep, state: State, scale):
        """Keeps the last ``reach - 1`` keys and values: constant memory per step."""
        keep = keep_or_ones(keep, q)
        if "k" in state:
            k, v, keep_all = (torch.cat([state[n], x], dim=2 if n != "keep" else 1)
                              for n, x in (("k", k), ("v", v), ("keep", keep)))
        else:
            keep_all = keep
        t, total, seen = q.shape[2], k.shape[2], state.get("seen", 0)
        pos_q = torch.arange(t, device=q.device)[:, None] + seen  # absolute positions
        pos_k = torch.arange(total, device=q.device)[None, :] + seen + t - total
        rel = pos_k - pos_q
        if self.config.mode == "sliding":
            inside = (rel <= 0) & (rel > -self.config.window)
        else:
            inside = (rel <= 0) & (pos_k >= pos_q // self.config.window * self.config.window - self.config.overlap)
        scores = (q.float() * scale) @ k.float().transpose(-1, -2)  # float32 softmax (SDPA's accumulation)
        if self.bias is not None:
            scores = scores + self._bias(rel, inside)[None]
        allowed = (inside & keep_all[:, None, None, :]) | (rel == 0)
        out = scores.masked_fill(~allowed, neg_fill(scores.dtype)).softmax(-1).to(v.dtype) @ v
        kept = self.config.reach - 1
        state["k"], state["v"] = k[:, :, max(0, total - kept):], v[:, :, max(0, total - kept):]
        state["keep"] = keep_all[:, max(0, total - kept):]
        state["seen"] = seen + t
        return out
