"""Encoder-decoder families: BART and Marian (``XAttention`` with ``q/k/v/out_proj``) and T5 (``T5Attention``).

Each has three kinds of site: encoder self-attention (``enc-self``), causal decoder self-attention
(``dec-self``) and decoder→encoder cross-attention (``dec-enc``, queries from the decoder, keys and values
from the encoder output, cached once per generation in ``EncoderDecoderCache``).
"""

from __future__ import annotations

from torch import nn

from .base import AttentionSite, FamilyLayout, Kind
from .families import _linear_site
from .registry import register_adapter

T5_NOTES = [
    "no 1/sqrt(d) scaling of q·k (scaling 1.0)",
    "relative position bias: one table [buckets, heads] in layer 0 of each self-attention stack, shared by every "
    "layer of that stack; head h of every layer adds column h (cross-attention adds none)",
    "masks, gates, L0 gates, mixers, analysis and surgery are exact (after surgery a site reads its heads' bias "
    "columns by their original index; the table itself is not sliced, it serves every layer)",
    "a swapped head takes its q/k/v (and o) weights to the other slot, not its bias column: the bias belongs to "
    "the slot (head index) and stays",
    "drop-in mechanisms are refused: they cannot add the position bias to their scores",
]


def _kind(module: nn.Module, cross: bool) -> Kind:
    if cross:
        return "dec-enc"
    return "dec-self" if module.is_decoder else "enc-self"


def bart_like(model: nn.Module) -> list[AttentionSite]:
    """BART, Marian: ``self_attn`` in encoder and decoder layers, ``encoder_attn`` (cross) in decoder layers.

    A decoder self-attention module is causal; its ``head_dim`` stays fixed, so the head count is read from
    ``out_proj`` (it shrinks under surgery; ``q_proj`` and ``k_proj`` change width when heads become collaborative)
    and the key/value head count from ``v_proj`` (fewer after ``headwise.conversion.convert_gqa``).
    """
    sites = []
    for path, m in model.named_modules():
        if not all(hasattr(m, n) for n in ("q_proj", "k_proj", "v_proj", "out_proj", "is_decoder", "head_dim")):
            continue
        cross = path.rsplit(".", 1)[-1] == "encoder_attn"
        heads, kv_heads = m.out_proj.in_features // m.head_dim, m.v_proj.out_features // m.head_dim
        sites.append(_linear_site(model, path, m, m.q_proj, m.k_proj, m.v_proj, m.out_proj,
                                  heads=heads, kv_heads=kv_heads, head_dim=m.head_dim, kind=_kind(m, cross),
                                  positions="absolute", causal=bool(m.is_causal)))
    return sites


def t5(model: nn.Module) -> list[AttentionSite]:
    """T5: ``SelfAttention`` / ``EncDecAttention`` (``T5Attention`` with bias-free ``q, k, v, o``, width ``d_kv``)."""
    sites = []
    for path, m in model.named_modules():
        if type(m).__name__ != "T5Attention":
            continue
        cross = path.rsplit(".", 1)[-1] == "EncDecAttention"
        d = m.key_value_proj_dim
        heads = m.v.out_features // d
        sites.append(
            _linear_site(model, path, m, m.q, m.k, m.v, m.o,
                         heads=heads, kv_heads=heads, head_dim=d, kind=_kind(m, cross),
                         positions="relative", causal=bool(m.is_causal),
                         notes=T5_NOTES[:1] + (["cross-attention: no position bias"] if cross else []) + T5_NOTES[1:])
        )
    return sites


register_adapter(["bart", "marian"], bart_like,
                 FamilyLayout(head_counts=("num_heads",), head_sizes=(), query="q_proj", key="k_proj",
                              kv_conversion=True, attention_form="bart"))
register_adapter("t5", t5, FamilyLayout(head_counts=("n_heads",), head_sizes=(), query="q", key="k",
                                        position_bias=True, attention_form="t5"))
