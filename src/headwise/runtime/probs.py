"""Attention probabilities as eager attention computes them: for a whole layer, or on request by query rows.

``softmax_attention`` (``attention.py``) computes ``probs[B, H, Tq, Tk]`` for the whole layer with
``attention_probs``. When a module's only readers of the probabilities are observers that take a ``ProbRows``,
the runtime computes the output with SDPA instead and hands them a ``ProbRows``: the same probabilities for any
span of query rows, computed under ``no_grad`` when asked, so no whole map is held and none is kept for a backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import repeat_kv


def query_rows(x: torch.Tensor | None, q0: int, q1: int) -> torch.Tensor | None:
    """Query rows ``q0:q1`` of a mask or bias ``x[..., Tq | 1, Tk]`` (a size-1 query dimension broadcasts: whole)."""
    return x if x is None or x.shape[-2] == 1 else x[..., q0:q1, :]


def keep_mask(
    attention_mask: torch.Tensor | None, q_len: int, k_len: int, causal: bool, device: torch.device,
    q0: int = 0, q1: int | None = None,
) -> torch.Tensor | None:
    """The boolean "may attend" mask ``[B|1, 1|H, n, Tk]`` of query rows ``q0:q1`` (default: all ``q_len``; None:
    everything is visible).

    Float masks are additive (0 keep, very negative drop). With no mask a causal module attends to
    ``j <= i`` (upper-left aligned, as SDPA's ``is_causal``).
    """
    q1 = q_len if q1 is None else q1
    if attention_mask is not None:
        mask = query_rows(attention_mask, q0, q1)[..., :k_len]
        return mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    if causal and q_len > 1:
        return (torch.arange(q0, q1, device=device)[:, None] >= torch.arange(k_len, device=device))[None, None]
    return None


def query_heads(kv: torch.Tensor, query: torch.Tensor, attention_mask: torch.Tensor | None,
                causal: bool) -> torch.Tensor:
    """Keys or values ``[B, Hkv, Tk, d]`` repeated to the query's heads ``[B, Hq, Tk, d]``; with no mask a causal
    module's keys past its ``Tq`` queries are cropped (an empty static cache), as SDPA crops them."""
    kv = repeat_kv(kv, query.shape[1] // kv.shape[1])
    q_len = query.shape[2]
    if attention_mask is None and causal and q_len > 1 and kv.shape[2] > q_len:
        kv = kv[:, :, :q_len]
    return kv


def attention_probs(
    query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None, keep: torch.Tensor | None,
    scaling: float, position_bias: torch.Tensor | None, dtype: torch.dtype,
) -> torch.Tensor:
    """``softmax(q·kᵀ·scaling + bias + mask)`` in float32, then ``dtype``: ``probs[B, H, n, Tk]`` for the ``n``
    query rows of ``query[B, H, n, d]`` against ``key[B, H, Tk, d]`` (``query_heads``). ``attention_mask``,
    ``position_bias`` and ``keep`` are those rows' (``query_rows``, ``keep_mask``); a float mask is added, a boolean
    one (or a causal ``keep``) sets dropped scores to the dtype's minimum (a fully masked row becomes uniform)."""
    k_len = key.shape[2]
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if position_bias is not None:
        scores = scores + position_bias[..., :k_len]
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        scores = scores + attention_mask[..., :k_len]
    elif keep is not None:
        scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
    return F.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)


class ProbRows:
    """The probabilities ``[B, H, Tq, Tk]`` of one attention call, computed when asked, by spans of query rows.

    Holds the call's ``query[B, H, Tq, d]``, its ``key`` repeated to the query heads, the mask, scaling and position
    bias (nothing that grows with ``Tq × Tk`` beyond the caller's own mask); ``shape`` is the map's. ``rows(q0, q1)``
    gives ``probs[B, H, q1 − q0, Tk]`` exactly as ``softmax_attention`` computes those rows (float32 softmax, then
    ``dtype``), under ``no_grad``; ``keep(q0, q1)`` their "may attend" mask ``[B|1, 1|H, q1 − q0, Tk]`` or None;
    ``full()`` the whole map at once, for consumers that need it.
    """

    def __init__(self, query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None, scaling: float,
                 causal: bool, position_bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        self.query = query.detach()
        self.key = query_heads(key.detach(), query, attention_mask, causal)
        self.mask = attention_mask
        self.bias = None if position_bias is None else position_bias.detach()
        self.scaling, self.causal, self.dtype = scaling, causal, dtype
        self.shape = torch.Size((*query.shape[:3], self.key.shape[2]))
        self.device = query.device

    def keep(self, q0: int, q1: int) -> torch.Tensor | None:
        return keep_mask(self.mask, self.shape[2], self.shape[3], self.causal, self.device, q0, q1)

    @torch.no_grad()
    def rows(self, q0: int, q1: int) -> torch.Tensor:
        return attention_probs(self.query[:, :, q0:q1], self.key, query_rows(self.mask, q0, q1), self.keep(q0, q1),
                               self.scaling, query_rows(self.bias, q0, q1), self.dtype)

    def full(self) -> torch.Tensor:
        return self.rows(0, self.shape[2])
