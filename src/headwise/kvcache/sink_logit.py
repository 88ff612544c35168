"""A streaming head's sink tokens replaced by a *sink logit*: one constant per query head added to its softmax.

vLLM keeps no per-request "first tokens" in a sliding window, but its attention backends take gpt-oss-style
attention sinks: a logit ``s_h`` per query head that joins the softmax's denominator as a virtual key with a zero
value. A streaming head (sink 0, window ``W``) with a sink logit computes, for a query ``q`` over its visible keys
``k_j`` (values ``v_j``)::

    out = Σ_j exp(scale·q·k_j) v_j / (exp(s_h) + Σ_j exp(scale·q·k_j))
        = sdpa(q, k, v) · sigmoid(lse − s_h),   lse = log Σ_j exp(scale·q·k_j)

so the sink tokens' mass is kept as a constant and their values are dropped. ``sink_logits`` calibrates ``s_h``
as the mean (or median) over calibration queries of the log-sum-exp of ``scale·q·k`` over the first ``sink``
tokens, on queries far enough that those tokens lie outside the window. ``sink_logit_cache`` builds the
``PolicyCache`` whose streaming groups attend that way (``SinkLogitLayer``); full heads are unchanged.
``apply_kv_policy(model, policy, sink_logits=...)`` records them with the policy: ``generate`` then runs them, and
``clients.vllm.export_vllm`` writes them for the vLLM plugin, which passes them to vLLM's attention as ``sinks``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from ..errors import HeadwiseError
from .cache import PolicyCache
from .layer import Group, PolicyLayer, _sdpa
from .policy import KVPolicy

PROBE = "headwise_sink_probe"  # the attention implementation sink_logits runs the model with
REDUCTIONS = ("mean", "median")


class SinkLogitLayer(PolicyLayer):
    """A ``PolicyLayer`` whose streaming groups add the sink logit of each query head (``logits [Hkv, g]``: the
    ``g`` query heads of every KV head) to their softmax (see the module docstring)."""

    def __init__(self, rules, logits: torch.Tensor) -> None:
        super().__init__(rules)
        if logits.shape[0] != len(rules):
            raise HeadwiseError(f"sink logits give {logits.shape[0]} KV heads for a layer of {len(rules)}")
        self.logits = logits

    def attend_window(self, group: Group, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                      mask: torch.Tensor | None, scaling: float, dropout: float) -> torch.Tensor:
        out = _sdpa(query, keys, values, mask, scaling, dropout, False)
        heads, group_size = keys.shape[1], query.shape[1] // keys.shape[1]
        scores = scaling * torch.matmul(query.float(), keys.float().repeat_interleave(group_size, 1).transpose(-1, -2))
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        sink = self.logits[group.heads].reshape(heads * group_size).to(scores.device)
        keep = torch.sigmoid(torch.logsumexp(scores, -1) - sink[None, :, None])  # [B, h·g, Tq]
        return (out.float() * keep[..., None]).to(out.dtype)


def checked_sink_logits(policy: KVPolicy, model: nn.Module, logits: torch.Tensor) -> torch.Tensor:
    """``logits`` as float32 ``[L, Hkv, g]`` when that is the shape of ``model``'s query heads under ``policy``, else
    ``HeadwiseError`` naming both shapes."""
    logits = torch.as_tensor(logits, dtype=torch.float32).detach().cpu()
    group = model.config.num_attention_heads // (getattr(model.config, "num_key_value_heads", None)
                                                 or model.config.num_attention_heads)
    shape = (len(policy.heads), len(policy.heads[0]), group)
    if tuple(logits.shape) != shape or not torch.isfinite(logits).all():
        raise HeadwiseError(f"sink_logits must be finite, of shape [layers, KV heads, query heads per KV head] = "
                            f"{list(shape)}, not {list(logits.shape)}; calibrate them with "
                            "headwise.kvcache.sink_logit.sink_logits(model, prompts, sink, window)")
    return logits


def sink_logit_cache(policy: KVPolicy, logits: torch.Tensor, length: int | None = None) -> PolicyCache:
    """The ``PolicyCache`` of ``policy`` for ``length`` tokens whose streaming heads add ``logits [L, Hkv, g]``
    (``sink_logits``) to their softmax; layers of full heads only are the default cache's."""
    cache = PolicyCache(policy, length=length)
    rules = policy.at(length).heads
    if logits.shape[0] != len(rules):
        raise HeadwiseError(f"sink logits cover {logits.shape[0]} layers, the policy {len(rules)}")
    cache.layers = [SinkLogitLayer(rules[i], logits[i]) if isinstance(layer, PolicyLayer) else layer
                    for i, layer in enumerate(cache.layers)]
    return cache


@torch.no_grad()
def sink_logits(model: nn.Module, prompts: list[torch.Tensor], sink: int, window: int,
                reduce: str = "mean") -> torch.Tensor:
    """``[L, Hkv, g]``: per query head, the ``reduce`` (mean or median) over the queries of ``prompts`` (``[T]``
    ids each) at positions ``> sink + window`` of ``log Σ_{j < sink} exp(scale·q·k_j)``, the attention logit mass
    of the first ``sink`` tokens. The model runs without a KV policy (its own attention, recorded on the way)."""
    if reduce not in REDUCTIONS:
        raise HeadwiseError(f"reduce={reduce!r}: use one of {', '.join(REDUCTIONS)}")
    if sink < 1 or not prompts or min(len(p) for p in prompts) <= sink + window + 1:
        raise HeadwiseError(f"sink_logits needs sink ≥ 1 and prompts longer than sink + window + 1 = "
                            f"{sink + window + 1} tokens")
    seen: dict[int, list[torch.Tensor]] = {}

    def probe(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
              **kwargs: Any) -> tuple[torch.Tensor, None]:
        scale = query.shape[-1] ** -0.5 if scaling is None else scaling
        group = query.shape[1] // key.shape[1]
        q = query[0, :, sink + window + 1:].float()  # [Hq, Tq, d]
        k = key[0, :, :sink].float().repeat_interleave(group, 0)  # [Hq, S, d]
        seen.setdefault(module.layer_idx, []).append(torch.logsumexp(scale * q @ k.transpose(-1, -2), -1))
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)

    AttentionInterface.register(PROBE, probe)
    before = model.config._attn_implementation
    model.set_attn_implementation(PROBE)
    try:
        for ids in prompts:
            model(input_ids=ids[None].to(next(model.parameters()).device), use_cache=False)
    finally:
        model.set_attn_implementation(before)
    layers = [torch.cat(seen[i], -1) for i in sorted(seen)]  # [Hq, queries]
    kv_heads = model.config.num_key_value_heads
    if reduce == "median":
        values = torch.stack([lse.median(-1).values for lse in layers])
    else:
        values = torch.stack([lse.mean(-1) for lse in layers])
    return values.reshape(len(layers), kv_heads, -1)

