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
    ``position_bias`` and ``keep`` are those rows' (``query_rows``, ``keep_mask``); see ``probs_of_scores``."""
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling
    return probs_of_scores(scores, attention_mask, keep, position_bias, dtype)


def grouped_scores(query: torch.Tensor, key: torch.Tensor, scaling: float) -> torch.Tensor:
    """``query[B, H, n, d] · key[B, Hkv, Tk, d]ᵀ · scaling`` → ``[B, H, n, Tk]``, each query head against its key
    head ``h // (H / Hkv)`` (as ``repeat_kv`` pairs them) without repeating the keys: a group's query rows are
    stacked into one matrix product."""
    B, H, n, d = query.shape
    groups = H // key.shape[1]
    if groups == 1:
        return torch.matmul(query, key.transpose(-1, -2)).mul_(scaling)
    stacked = query.reshape(B, key.shape[1], groups * n, d)
    return torch.matmul(stacked, key.transpose(-1, -2)).mul_(scaling).view(B, H, n, key.shape[2])


def probs_of_scores(scores: torch.Tensor, attention_mask: torch.Tensor | None, keep: torch.Tensor | None,
                    position_bias: torch.Tensor | None, dtype: torch.dtype, inplace: bool = False) -> torch.Tensor:
    """``softmax(scores + bias + mask)`` in float32, then ``dtype``, for ``scores[B, H, n, Tk]`` and those rows'
    mask, bias and ``keep`` (a float mask is added, a boolean one or a causal ``keep`` sets dropped scores to the
    dtype's minimum: a fully masked row becomes uniform). ``inplace``: bias and mask go into ``scores`` itself (a
    caller's own scores, no graph: one copy fewer)."""
    k_len = scores.shape[-1]
    if position_bias is not None:
        scores = scores.add_(position_bias[..., :k_len]) if inplace else scores + position_bias[..., :k_len]
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        scores = scores.add_(attention_mask[..., :k_len]) if inplace else scores + attention_mask[..., :k_len]
    elif keep is not None:
        fill = torch.finfo(scores.dtype).min
        scores = scores.masked_fill_(~keep, fill) if inplace else scores.masked_fill(~keep, fill)
    return F.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)


class ProbRows:
    """The probabilities ``[B, H, Tq, Tk]`` of one attention call, computed when asked, by spans of query rows.

    Holds the call's ``query[B, H, Tq, d]``, its ``key[B, Hkv, Tk, d]`` (not repeated to the query heads), the
    mask, scaling and position bias (nothing that grows with ``Tq × Tk`` beyond the caller's own mask); ``shape``
    is the map's. ``rows(q0, q1, k1)`` gives ``probs[B, H, q1 − q0, k1]``, the first ``k1`` keys (default: all) of
    those rows exactly as ``softmax_attention`` computes them (float32 softmax, then ``dtype``), under ``no_grad``
    — exact for any ``k1 ≥ key_end(q0, q1)``, as the rows give the keys past it no weight; ``keep(q0, q1, k1)``
    their "may attend" mask ``[B|1, 1|H, q1 − q0, k1]`` or None; ``full()`` the whole map at once, for consumers
    that need it.
    """

    def __init__(self, query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None, scaling: float,
                 causal: bool, position_bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        self.query = query.detach()
        self.key = key.detach()
        if attention_mask is None and causal and query.shape[2] > 1 and key.shape[2] > query.shape[2]:
            self.key = self.key[:, :, : query.shape[2]]  # an empty static cache, cropped as SDPA crops it
        self.mask = attention_mask
        self.bias = None if position_bias is None else position_bias.detach()
        self.scaling, self.causal, self.dtype = scaling, causal, dtype
        self.shape = torch.Size((*query.shape[:3], self.key.shape[2]))
        self.device = query.device

    def keep(self, q0: int, q1: int, k1: int | None = None) -> torch.Tensor | None:
        keep = keep_mask(self.mask, self.shape[2], self.shape[3], self.causal, self.device, q0, q1)
        return keep if keep is None or k1 is None else keep[..., :k1]

    def key_end(self, q0: int, q1: int) -> int:
        """One past the last key any of rows ``q0:q1`` may attend to (at least 1): a causal row ``i`` sees keys
        ``≤ i``; with a mask, the last key its rows keep."""
        keep = self.keep(q0, q1)
        if keep is None:
            return self.shape[3]
        seen = keep.reshape(-1, keep.shape[-1]).any(0).nonzero()
        return max(1, int(seen[-1]) + 1) if len(seen) else 1

    @torch.no_grad()
    def rows(self, q0: int, q1: int, k1: int | None = None) -> torch.Tensor:
        k1 = self.shape[3] if k1 is None else k1
        mask, bias = query_rows(self.mask, q0, q1), query_rows(self.bias, q0, q1)
        scores = grouped_scores(self.query[:, :, q0:q1], self.key[:, :, :k1], self.scaling)
        return probs_of_scores(scores, None if mask is None else mask[..., :k1], self.keep(q0, q1, k1),
                               None if bias is None else bias[..., :k1], self.dtype, inplace=True)

    def full(self) -> torch.Tensor:
        return self.rows(0, self.shape[2])
