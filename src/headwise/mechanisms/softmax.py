"""Exact softmax attention through PyTorch's fused ``scaled_dot_product_attention`` (the reference)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .base import Mechanism, MechanismConfig, State, register


@dataclass
class SoftmaxConfig(MechanismConfig):
    pass


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None, causal: bool, scale: float,
         offset: int = 0) -> torch.Tensor:
    """SDPA with a key mask ``keep [B, Tk]``; causal queries sit at positions ``offset + i`` of the keys.

    A query that would see no key (a left-padded causal row) is allowed its own position, so no row is NaN.
    """
    tq, tk = q.shape[2], k.shape[2]
    if keep is None and (not causal or (offset == 0 and tq == tk)):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    mask = torch.ones(1, 1, tq, tk, dtype=torch.bool, device=q.device) if keep is None else keep[:, None, None, :]
    if causal:
        rows = torch.arange(tq, device=q.device)[:, None] + offset
        cols = torch.arange(tk, device=q.device)[None, :]
        mask = mask & (cols <= rows)
        mask = mask | (cols == rows)  # padded queries see themselves (their output is unspecified anyway)
    else:
        mask = mask | ~mask.any(-1, keepdim=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


@register
class Softmax(Mechanism):
    """``softmax(q kᵀ · scale) v``, exact; O(T²) time, memory linear in T with PyTorch's fused kernels."""

    name = "softmax"
    config_class = SoftmaxConfig
    complexity = "O(T² d) time (exact)"
    compute_dtype = None  # SDPA accumulates in float32 itself

    def attend(self, q, k, v, keep, causal, scale):
        return sdpa(q, k, v, keep, causal, scale)

    def decode(self, q, k, v, keep, state: State, scale):
        past = state.get("k")
        keep = torch.ones(q.shape[0], q.shape[2], dtype=torch.bool, device=q.device) if keep is None else keep
        state["k"] = k if past is None else torch.cat([past, k], dim=2)
        state["v"] = v if past is None else torch.cat([state["v"], v], dim=2)
        state["keep"] = keep if past is None else torch.cat([state["keep"], keep], dim=1)
        return sdpa(q, state["k"], state["v"], state["keep"], True, scale, offset=state["k"].shape[2] - q.shape[2])
