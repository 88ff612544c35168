"""EVA as published (Zheng et al., ICLR 2023; the HKUNLP reference's ``eva``): local windows + one randomized
control-variate summary per chunk, with adaptive (learned) proposals; 1D (causal or not) and 2D.

Tokens are cut into blocks of ``window`` queries that attend exactly to their block plus ``overlap`` keys on each
side (overlapping windows), and into ``C = num_landmarks`` chunks (also extended by ``overlap``). Chunk ``c`` has a
proposal ``μ_c = (f_q(q̄_c) + f_k(k̄_c)) / 2`` from its mean query and key, a sample ``ω_c = μ_c + ε`` (training;
``ω_c = μ_c`` in evaluation), a value ``β_c = Σ_j softmax_j(ω_cᵀk_j − |k_j|²/2) v_j`` (self-normalised importance
sampling over the chunk) and a key ``f_k(k̄_c)``. Each query takes one softmax over its window scores ``qᵀk_j`` and
the chunk scores ``qᵀf_k(k̄_c)`` and mixes window values and ``β``. Queries and keys are scaled by ``√scale`` first.

``adaptive``: ``default`` (``f = `` Linear + LayerNorm, the paper's), ``no-ln`` (Linear), ``none`` (``μ = 0``, key
``f_k(k̄)`` with Linear + LayerNorm) or ``mean`` (``f`` = identity, no parameters: for a pretrained model without
training). Linear maps start at the identity. ``grid > 0``: the 2D form for image tokens (a ``grid``-wide row-major
grid; windows and chunks are squares). Every step is differentiable (nothing detached): the gradient is that of
the estimator.

Causal (the paper's decoder form, the reference's ``causal_eva``): chunks of ``chunk_size`` tokens (default
``window``) aligned with the blocks; a query sees its block's keys up to itself (and the ``overlap`` keys before the
block) and the summaries of the chunks that end before its block. A chunk's summary depends on its own tokens only,
so the output is causal; incremental decoding keeps the history and recomputes (exact, like the full forward; the
summaries use past queries, so a model's cached generation, which keeps only keys and values, needs
``adaptive="none"``). Cost ``O(T (w + T/c) d)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from ..errors import HeadwiseError
from .base import Mechanism, ceil_div, keep_or_ones, neg_fill, positive, register
from .lara import Adaptive
from .randomness import POLICIES, Draws, RandomConfig

ADAPTIVE = ("default", "no-ln", "none", "mean")


@dataclass
class EVAPaperConfig(RandomConfig):
    redraw: str = field(default="every_step", metadata={"help": "when training draws fresh proposal samples",
                                                                "choices": POLICIES})
    window: int = field(default=16, metadata={"help": "queries per local block (2D: block side)"})
    overlap: int = field(default=0, metadata={"help": "extra keys each block and chunk sees on each side (1D)"})
    num_landmarks: int = field(default=49, metadata={"help": "number of chunks C (2D: a square number)"})
    adaptive: str = field(default="default", metadata={"help": "proposal maps: default (Linear+LayerNorm), no-ln, "
                                                                "none or mean (no parameters)", "choices": ADAPTIVE})
    grid: int = field(default=0, metadata={"help": "2D form: grid width in tokens (0: 1D)"})
    chunk_size: int = field(default=0, metadata={"help": "causal: tokens per chunk summary, a divisor of window "
                                                         "(0: window)"})

    def check(self) -> None:
        super().check()
        positive("window", self.window)
        positive("overlap", self.overlap, 0)
        positive("num_landmarks", self.num_landmarks)
        positive("grid", self.grid, 0)
        positive("chunk_size", self.chunk_size, 0)
        if self.chunk_size and self.window % self.chunk_size:
            raise HeadwiseError(f"eva-paper: chunk_size {self.chunk_size} must divide window {self.window}")
        if self.adaptive not in ADAPTIVE:
            raise HeadwiseError(f"eva-paper: adaptive must be one of {', '.join(ADAPTIVE)}, got {self.adaptive!r}")
        if self.grid and self.overlap:
            raise HeadwiseError("eva-paper: overlap is for the 1D form; the 2D form (grid > 0) uses overlap=0")


class LinearMap(nn.Module):
    """Linear map of the head dimension, identity at start, run in its input's dtype."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        nn.init.eye_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.linear.weight.to(x.dtype), self.linear.bias.to(x.dtype))


def partition(x: torch.Tensor, size: int, ext: int, count: int, dim: int = 2) -> torch.Tensor:
    """Overlapping pieces along ``dim``: ``count`` pieces of ``size + 2·ext`` (zero-padded), a new dim after ``dim``
    holding the piece index and the piece length moved last-but-one (``[b, h, n, k, e]`` for ``[b, h, T, e]``)."""
    pad = [0, 0] * (x.dim() - dim - 1) + [ext, count * size - x.shape[dim] + ext]
    pieces = (F.pad(x, pad) if any(pad) else x).unfold(dim, size + 2 * ext, size)  # [..., n, (rest), k]
    return pieces.movedim(-1, dim + 1)


@register
class EVAPaper(Mechanism):
    """Published EVA: overlapping local windows + adaptive randomized control variates; O(T (w + C) d)."""

    name = "eva-paper"
    config_class = EVAPaperConfig
    complexity = "O(T (w + C) d)"

    def __init__(self, num_heads: int, head_dim: int, **args) -> None:
        super().__init__(num_heads, head_dim, **args)
        self.draws = Draws(self.config)
        kind = self.config.adaptive
        self.q_map = {"default": Adaptive, "no-ln": LinearMap}.get(kind, lambda d: None)(head_dim)
        self.k_map = {"default": Adaptive, "no-ln": LinearMap, "none": Adaptive}.get(kind, lambda d: None)(head_dim)

    def check_causal(self, causal: bool) -> None:
        if causal and self.config.grid:
            raise HeadwiseError("eva-paper: the 2D form (grid > 0) cannot be causal; use grid=0 for a decoder")

    def uses_past_queries(self) -> bool:
        return self.config.adaptive != "none"  # proposals use the chunks' mean queries

    def _pieces(self, q, k, v, keep, t, causal):
        """Blocks and chunks as ``[b, h, n, k, e]`` pieces with their ``[b, 1, n, k]`` masks (1D or 2D); causal
        chunks have ``chunk_size`` tokens (default ``window``), aligned with the blocks, and no overlap."""
        cfg = self.config
        if cfg.grid:
            rows, cols = ceil_div(t, cfg.grid), cfg.grid
            if rows * cols != t:
                raise HeadwiseError(f"eva-paper: {t} tokens do not form a {cols}-wide grid; set grid= (width)")
            side = max(1, math.isqrt(min(cfg.num_landmarks, t)))
            chunk = (ceil_div(rows, side), ceil_div(cols, side))
            w = (min(cfg.window, rows), min(cfg.window, cols))

            def split(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
                x = rearrange(x, "b h (y x) e -> b h y x e", x=cols)
                x = F.pad(x, (0, 0, 0, -cols % size[1], 0, -rows % size[0]))
                return rearrange(x, "b h (ny sy) (nx sx) e -> b h (ny nx) (sy sx) e", sy=size[0], sx=size[1])

            mask = keep[:, None, :, None].to(q.dtype)
            return ([split(x, w) for x in (q, k, v)], split(mask, w)[..., 0] > 0,
                    [split(x, chunk) for x in (q, k, v)], split(mask, chunk)[..., 0] > 0)
        w = min(cfg.window, t)
        n = ceil_div(t, w)
        c = (cfg.chunk_size or cfg.window) if causal else ceil_div(t, min(cfg.num_landmarks, t))
        nc = ceil_div(t, c)
        ext = cfg.overlap
        blocks = [partition(q, w, 0, n)] + [partition(x, w, ext, n) for x in (k, v)]
        block_keep = partition(keep[:, None, :, None], w, ext, n)[..., 0]
        chunk_ext = 0 if causal else ext
        chunks = [partition(x, c, chunk_ext, nc) for x in (q, k, v)]
        return blocks, block_keep, chunks, partition(keep[:, None, :, None], c, chunk_ext, nc)[..., 0]

    def _causal_mask(self, n: int, w: int, kw: int, nc: int, device: torch.device) -> torch.Tensor:
        """``[n, w, kw + nc]``: a query sees its block's keys up to itself (and the ``overlap`` before the block)
        and the chunks that end before its block starts."""
        c, ext = self.config.chunk_size or self.config.window, self.config.overlap
        query = torch.arange(w, device=device)[:, None]
        window = (torch.arange(kw, device=device)[None, :] - ext <= query)[None].expand(n, w, kw)
        chunk_end = (torch.arange(nc, device=device) + 1) * c
        chunks = (chunk_end[None, :] <= torch.arange(n, device=device)[:, None] * w)[:, None].expand(n, w, nc)
        return torch.cat([window, chunks], dim=-1)

    def attend(self, q, k, v, keep, causal, scale):
        b, h, t, d = q.shape
        cfg = self.config
        # no padded token, no overlap, whole 1D blocks: every window key and chunk summary is visible
        padded = keep is not None
        unmasked = not padded and not causal and not cfg.grid and not cfg.overlap and t % min(cfg.window, t) == 0
        keep = keep_or_ones(keep, q)
        self.draws.step(self.training)
        q, k = q * scale ** 0.5, k * scale ** 0.5
        (wq, wk, wv), wkeep, (cq, ck, cv), ckeep = self._pieces(q, k, v, keep, t, causal)
        weight = ckeep[..., None].to(q.dtype)
        count = weight.sum(-2)
        # chunk means over real tokens (the pieces are zero-padded, so only padded tokens need the weight)
        q_bar, k_bar = ((x * weight if padded else x).sum(-2) / count.clamp_min(1) for x in (cq, ck))  # [b,h,nc,d]
        chunk_key = self.k_map(k_bar) if self.k_map is not None else k_bar
        if self.config.adaptive == "none":
            mu = torch.zeros_like(k_bar)
        else:
            mu = ((self.q_map(q_bar) if self.q_map is not None else q_bar) + chunk_key) / 2
        omega = mu
        if self.training:
            omega = mu + torch.randn(mu.shape, generator=self.draws.generator(mu.device), device=mu.device,
                                     dtype=mu.dtype)
        fill = neg_fill(q.dtype)
        log_w = torch.einsum("bhnkd,bhnd->bhnk", ck, omega) - ck.pow(2).sum(-1) / 2
        beta = torch.einsum("bhnk,bhnkd->bhnd", log_w.masked_fill(~ckeep, fill).softmax(-1), cv)
        valid = count[..., 0] > 0  # [b, 1, nc]
        # one fused SDPA call per block over [its window keys, every chunk key] and [window values, β]
        n, nc = wq.shape[2], chunk_key.shape[2]
        spread = lambda x: x[:, :, None].expand(b, h, n, nc, d)  # noqa: E731
        keys = torch.cat([wk, spread(chunk_key)], dim=3)
        values = torch.cat([wv, spread(beta)], dim=3)
        allowed = torch.cat([wkeep, valid[:, :, None].expand(b, 1, n, nc)], dim=-1)[:, :, :, None]  # [b,1,n,1,k]
        if causal:
            allowed = allowed & self._causal_mask(n, wq.shape[3], wk.shape[3], nc, q.device)
        mask = None if unmasked else torch.zeros_like(allowed, dtype=q.dtype).masked_fill_(~allowed, fill)
        flat = lambda x: None if x is None else rearrange(x, "b h n k e -> (b n) h k e")  # noqa: E731
        out = F.scaled_dot_product_attention(flat(wq), flat(keys), flat(values), attn_mask=flat(mask), scale=1.0)
        out = rearrange(out, "(b n) h w d -> b h n w d", b=b)
        return self._merge(out, t)

    def _merge(self, out: torch.Tensor, t: int) -> torch.Tensor:
        """``[b, h, n, w, d]`` block outputs back to ``[b, h, T, d]``."""
        cfg = self.config
        if not cfg.grid:
            return rearrange(out, "b h n w d -> b h (n w) d")[:, :, :t]
        rows, cols = t // cfg.grid, cfg.grid
        wy, wx = min(cfg.window, rows), min(cfg.window, cols)
        out = rearrange(out, "b h (ny nx) (sy sx) d -> b h (ny sy) (nx sx) d", nx=ceil_div(cols, wx), sy=wy, sx=wx)
        return rearrange(out[:, :, :rows, :cols], "b h y x d -> b h (y x) d")
