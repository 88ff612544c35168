"""The standalone attention module: its own q/k/v/o projections around a mechanism core."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from ..errors import HeadwiseError
from .base import Mechanism, State


class DecodingCache:
    """Incremental-decoding state of one ``EfficientAttention`` (pass the same object at every step)."""

    def __init__(self) -> None:
        self.state: State = {}
        self.length = 0


class EfficientAttention(nn.Module):
    """Multi-head self-attention over ``[B, T, dim]`` whose softmax step is a mechanism core.

    ``forward(x, key_padding_mask=None, causal=None, cache=None)``: ``key_padding_mask [B, T]`` bool (True: padded),
    ``causal`` defaults to the constructor's; with ``cache`` (a ``DecodingCache``) ``x`` holds the next tokens of a
    causal sequence and only they are computed.
    """

    def __init__(self, core: Mechanism, dim: int, causal: bool = False, qkv_bias: bool = True,
                 attn_drop: float = 0.0, proj_drop: float = 0.0) -> None:
        super().__init__()
        if dim != core.num_heads * core.head_dim:
            raise HeadwiseError(f"dim {dim} must equal num_heads × head_dim ({core.num_heads} × {core.head_dim})")
        core.check_causal(causal)
        self.core, self.dim, self.causal = core, dim, causal
        self.q, self.k, self.v = (nn.Linear(dim, dim, bias=qkv_bias) for _ in range(3))
        self.o = nn.Linear(dim, dim)
        self.attn_drop, self.proj_drop = nn.Dropout(attn_drop), nn.Dropout(proj_drop)

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``q, k, v [B, H, T, d]`` from one GEMM over the stacked projection weights (one pass over ``x`` forward and
        backward instead of three; the three Linears stay separate parameters)."""
        weight = torch.cat([self.q.weight, self.k.weight, self.v.weight])
        bias = None if self.q.bias is None else torch.cat([self.q.bias, self.k.bias, self.v.bias])
        qkv = F.linear(x, weight, bias)
        return rearrange(qkv, "b t (three h d) -> three b h t d", three=3, h=self.core.num_heads).unbind(0)

    def new_cache(self) -> DecodingCache:
        if not self.causal:
            raise HeadwiseError("incremental decoding needs a causal module: build it with causal=True")
        return DecodingCache()

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, causal: bool | None = None,
                cache: DecodingCache | None = None) -> torch.Tensor:
        causal = self.causal if causal is None else causal
        q, k, v = self._qkv(x)
        if cache is not None:
            if not causal:
                raise HeadwiseError("a decoding cache needs causal attention")
            self.core.check_causal(True)
            keep = None if key_padding_mask is None else ~key_padding_mask.to(torch.bool)
            out = self.core.step(q, k, v, keep, cache.state, q.shape[-1] ** -0.5)
            cache.length += x.shape[1]
        else:
            out = self.core(q, k, v, key_padding_mask, causal)
        out = self.attn_drop(out)  # mechanisms have no probabilities to drop: dropout acts on their output
        return self.proj_drop(self.o(rearrange(out, "b h t d -> b t (h d)")))
