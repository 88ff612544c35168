"""DuoAttention-style gates: one ``α ∈ [0, 1]`` per KV head mixes full and sink + window attention.

Each attention site of a decoder gets a ``KVGate`` in its mechanism slot; the output of query head ``h`` (KV head
``h // group``) is ``α·full + (1 − α)·streaming(sink, window)``, both computed in the same forward from the
model's own queries, keys and values. Only ``α`` is a parameter. Gates are transient (learn them with
``headwise.training.train_kv_gates``, read them with ``kv_gate_values``, take them off with ``remove_kv_gates``); they are not saved.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import repeat
from torch import nn

from ..errors import HeadwiseError
from ..runtime import enable
from ..runtime.attention import left_padding
from ..runtime.ops import attach, attached, detach_all, ops_of
from ..sites import find_sites
from .policy import model_shape, streaming

GATE = "kv_gate"


def _attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, allowed: torch.Tensor, scaling: float,
            dropout: float) -> torch.Tensor:
    """Softmax attention ``[B, H, Tq, d]`` over the keys ``allowed [B|1, 1|H, Tq, Tk]`` lets each query see (a query
    that sees nothing, a padding position, sees every key instead of producing NaN)."""
    allowed = allowed | ~allowed.any(-1, keepdim=True)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=allowed, dropout_p=dropout, scale=scaling)


class KVGate(nn.Module):
    """The mechanism of one site: ``alpha [Hkv]``, out ``= α·full + (1 − α)·streaming(sink, window)`` per KV head.

    ``bypass = True`` returns the full attention alone (the teacher of the distillation)."""

    def __init__(self, num_kv_heads: int, sink: int, window: int, init: float = 1.0) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.full((num_kv_heads,), float(init)))
        self.sink, self.window = sink, window
        self.bypass = False

    def forward(self, module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                keep: torch.Tensor | None, scaling: float, dropout: float, causal: bool) -> torch.Tensor:
        """``query [B, Hq, Tq, d]``, ``key``/``value [B, Hkv, Tk, d]`` → ``out [B, Tq, Hq, d]``."""
        group = query.shape[1] // key.shape[1]
        key, value = (repeat(t, "b h t d -> b (h g) t d", g=group) for t in (key, value))
        q_len, k_len = query.shape[2], key.shape[2]
        q_pos = torch.arange(k_len - q_len, k_len, device=query.device)
        k_pos = torch.arange(k_len, device=query.device)
        distance = q_pos[:, None] - k_pos[None, :]  # [Tq, Tk]
        allowed = distance >= 0 if causal else torch.ones_like(distance, dtype=torch.bool)
        if keep is not None:
            allowed = allowed & keep
        dropout = dropout if module.training else 0.0
        full = _attend(query, key, value, allowed, scaling, dropout)
        if self.bypass:
            return full.transpose(1, 2)
        pads = 0 if keep is None else left_padding(keep)[:, None, None, None]  # sinks: a row's first real tokens
        window = (k_pos - pads < self.sink) | (distance <= self.window)
        stream = _attend(query, key, value, allowed & window, scaling, dropout)
        alpha = repeat(self.alpha, "h -> (h g) 1 1", g=group).to(full.dtype)
        return (alpha * full + (1 - alpha) * stream).transpose(1, 2)


def add_kv_gates(model: nn.Module, sink: int, window: int, init: float = 1.0) -> list[KVGate]:
    """Attach a ``KVGate`` (``α = init`` on every KV head) to every decoder self-attention site of ``model``;
    returns them in layer order. Refuses models a KV policy cannot serve and sites that already run a mechanism."""
    model_shape(model)  # decoder-only family, full-attention layers
    streaming(sink, window)  # validates sink / window
    if not 0.0 <= float(init) <= 1.0:
        raise HeadwiseError(f"gate init={init} must be in [0, 1] (1: every head starts full)")
    sites = [s for s in find_sites(model) if s.kind == "dec-self"]
    busy = [s.name for s in sites if (ops := ops_of(s)) is not None and len(ops.mechanism)]
    if busy:
        raise HeadwiseError(f"{busy[0]} already runs a mechanism ({len(busy)} sites); remove it (or the KV gates: "
                            "headwise.kvcache.remove_kv_gates) before adding KV gates")
    enable(model)
    return [attach(s, "mechanism", GATE, KVGate(s.num_kv_heads, sink, window, init)) for s in sites]


def kv_gates(model: nn.Module) -> list[KVGate]:
    """The attached gates in layer order (empty without any)."""
    return list(attached(model, "mechanism", GATE).values())


def kv_gate_values(model: nn.Module) -> torch.Tensor:
    """``α [layers, KV heads]`` (float32, CPU) of the attached gates."""
    gates = kv_gates(model)
    if not gates:
        raise HeadwiseError("this model has no KV gates; add them with headwise.kvcache.add_kv_gates")
    return torch.stack([g.alpha.detach().float().cpu() for g in gates])


def remove_kv_gates(model: nn.Module) -> nn.Module:
    """Take every KV gate off ``model`` (raises ``HeadwiseError`` when it carries none); returns the model."""
    detach_all(model, GATE, missing_ok=False)
    return model
