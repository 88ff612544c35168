"""The ``headwise`` attention implementation, registered in transformers' attention and mask interfaces.

Transformers calls ``headwise_attention(module, q[B, Hq, Tq, d], k[B, Hkv, Tk, d], v, mask, ...)`` and expects
``(out[B, Tq, Hq, d], probs[B, Hq, Tq, Tk] | None)``. It takes the fastest path the module's ops allow:
mechanism → mechanism; probability ops, returned attentions or observers that need whole maps → explicit softmax;
otherwise PyTorch SDPA, its observers (those that take a ``ProbRows``) reading the probabilities by query rows.
Observers that are not ``active`` are skipped (the path does not change). Output ops (gates, mixers) run last on
every path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ..errors import HeadwiseError
from .ops import ATTR, HeadOps
from .probs import ProbRows, attention_probs, keep_mask, query_heads

NAME = "headwise"
# T5 passes one ``position_bias[1, H0, Tq, Tk]`` to every layer of a stack (H0: the stack's original head count).
# After surgery a module lists here the bias columns its remaining heads read (see ``pruning.surgery``).
BIAS_HEADS = "headwise_bias_heads"
# A per-head KV cache (``headwise.kvcache``) returns empty key/value carriers holding, under this attribute, an
# object whose ``attend(module, query, mask, scaling, dropout, causal) -> out[B, Tq, Hq, d]`` runs the attention.
GROUPED_KV = "headwise_grouped_kv"

try:  # transformers 5 records `output_attentions` through hooks and does not always pass the flag down
    from transformers.utils.output_capturing import _active_collector
except ImportError:  # pragma: no cover - older layouts
    _active_collector = None


def _attentions_requested(kwargs: dict) -> bool:
    if kwargs.get("output_attentions"):
        return True
    collected = _active_collector.get() if _active_collector is not None else None
    return bool(collected) and ("attentions" in collected or "cross_attentions" in collected)


def left_padding(keep: torch.Tensor) -> torch.Tensor:
    """Each row's left padding ``[B|1]`` from a "may attend" mask ``[B|1, 1|H, Tq, Tk]``: the index of the first key
    its last query sees (under a causal mask that query sees every real key), ``Tk`` when it sees none."""
    visible = keep[:, 0, -1, :]
    return torch.where(visible.any(-1), visible.to(torch.uint8).argmax(-1), visible.shape[-1])


def softmax_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float, dropout: float, causal: bool,
                      ops: HeadOps | None,
                      position_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Explicit softmax attention with probability ops and the active observers. Returns
    ``(out[B, Tq, H, d], probs[B, H, Tq, Tk])``."""
    key, value = query_heads(key, query, attention_mask, causal), query_heads(value, query, attention_mask, causal)
    keep = keep_mask(attention_mask, query.shape[2], key.shape[2], causal, query.device)
    probs = attention_probs(query, key, attention_mask, keep, scaling, position_bias, value.dtype)
    if ops is not None:
        for op in ops.prob.values():
            probs = op(probs, keep)
    probs_used = F.dropout(probs, p=dropout, training=module.training)
    out = torch.matmul(probs_used, value).transpose(1, 2)
    if ops is not None:
        for observe in ops.active_observers():
            observe(probs, keep, out)
    return out, probs


def sdpa(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
         attention_mask: torch.Tensor | None, dropout: float, scaling: float, causal: bool, **kwargs) -> torch.Tensor:
    """transformers' ``sdpa_attention_forward`` → ``out[B, Tq, Hq, d]``; on a CPU, for grouped keys (``Hkv < Hq``)
    under a mask, PyTorch's SDPA with ``enable_gqa`` (its CPU kernel reads each key head for its group of query
    heads) where transformers would repeat keys and values to every query head (two ``[B, Hq, Tk, d]`` copies: the
    largest tensors of a long masked call, e.g. a layer run by chunks of queries)."""
    if (query.device.type == "cpu" and attention_mask is not None and key.shape[1] < query.shape[1]
            and kwargs.get("position_bias") is None and kwargs.get("softcap") is None):
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask[..., : key.shape[-2]],
                                             dropout_p=dropout, scale=scaling, enable_gqa=True)
        return out.transpose(1, 2).contiguous()
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=causal, **kwargs)[0]


def headwise_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                       **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
    ops: HeadOps | None = getattr(module, ATTR, None)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    is_causal = kwargs.pop("is_causal", None)
    causal = bool(getattr(module, "is_causal", False) if is_causal is None else is_causal)
    want_probs = _attentions_requested(kwargs)
    bias_heads = getattr(module, BIAS_HEADS, None)
    if bias_heads is not None and kwargs.get("position_bias") is not None:
        kwargs["position_bias"] = kwargs["position_bias"][:, list(bias_heads)]
    probs = None
    observers = ops.active_observers() if ops is not None else []
    eager = want_probs or (ops is not None and ops.needs_maps)
    grouped = getattr(key, GROUPED_KV, None)
    if grouped is not None:
        if want_probs or (ops is not None and (ops.needs_probs or len(ops.mechanism))):
            raise HeadwiseError(f"{type(module).__name__}: a per-head KV cache cannot return attention probabilities "
                                "or run observers, probability ops or mechanisms; generate without the KV policy")
        out = grouped.attend(module, query, attention_mask, scaling, dropout, causal)
    elif ops is not None and len(ops.mechanism):
        if kwargs.get("position_bias") is not None:
            raise HeadwiseError(f"{type(module).__name__} adds a position bias to its attention scores; attention "
                                "mechanisms cannot add it, so they cannot run here (detach the mechanism)")
        mechanism = next(iter(ops.mechanism.values()))
        out = mechanism(module, query, key, value, keep_mask(attention_mask, query.shape[2], key.shape[2], causal,
                        query.device), scaling, dropout, causal)
    elif eager:
        out, probs = softmax_attention(module, query, key, value, attention_mask, scaling, dropout, causal, ops,
                                       kwargs.get("position_bias"))
    else:
        out = sdpa(module, query, key, value, attention_mask, dropout, scaling, causal, **kwargs)
        if observers:
            rows = ProbRows(query, key, attention_mask, scaling, causal, kwargs.get("position_bias"), value.dtype)
            for observe in observers:
                observe(rows, None, out)
    if ops is not None:
        for op in ops.output.values():
            out = op(out)
    return out, (probs if want_probs else None)


AttentionInterface.register(NAME, headwise_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)


def enable(model: nn.Module) -> nn.Module:
    """Select the ``headwise`` implementation on ``model`` (and its sub-models); returns the model.

    Every ``add_*`` / ``apply_*`` calls it, so attached ops always run. A model whose attention does not go
    through transformers' ``AttentionInterface`` cannot use it: ``HeadwiseError`` then says so."""
    if getattr(model.config, "_attn_implementation", None) == NAME:
        return model
    try:
        model.set_attn_implementation(NAME)
    except (ValueError, ImportError, AttributeError) as err:
        raise HeadwiseError(
            f"{type(model).__name__} cannot select the headwise attention implementation ({err}); headwise works "
            "on models whose attention goes through transformers' AttentionInterface (see `headwise sites`)"
        ) from err
    return model
