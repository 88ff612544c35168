"""One small adapter per model family. Each maps attention modules to ``AttentionSite`` objects.

Families share module layouts, so adapters are built from two helpers: ``_linear_site`` (separate q/k/v/o
``nn.Linear``) and the GPT-2 one (fused ``Conv1D``).
"""

from __future__ import annotations

import re
from dataclasses import replace

from torch import nn

from .base import AttentionSite, FamilyLayout, HeadProjection, Kind, Positions
from .registry import register_adapter

_LAYER_IN_PATH = re.compile(r"\.(\d+)\.")


def _layer_from(path: str, module: nn.Module) -> int:
    idx = getattr(module, "layer_idx", None)
    if idx is not None:
        return int(idx)
    found = _LAYER_IN_PATH.findall(f".{path}.")
    return int(found[-1]) if found else 0


def _linear_site(model: nn.Module, path: str, module: nn.Module, q: nn.Linear, k: nn.Linear, v: nn.Linear, o: nn.Linear,
                 *, heads: int, kv_heads: int, head_dim: int, kind: Kind, positions: Positions, causal: bool,
                 layers: tuple[int, ...] | None = None, notes: list[str] | None = None) -> AttentionSite:
    return AttentionSite(path=path, module=module, family=model.config.model_type, kind=kind,
                         layers=layers if layers is not None else (_layer_from(path, module),), num_heads=heads,
                         num_kv_heads=kv_heads, head_dim=head_dim, hidden_size=q.in_features, positions=positions,
                         causal=causal, q=HeadProjection(q, heads, head_dim), k=HeadProjection(k, kv_heads, head_dim),
                         v=HeadProjection(v, kv_heads, head_dim), o=HeadProjection(o, heads, head_dim, axis="in"),
                         notes=notes or [])


def _bert_positions(config) -> Positions:
    kind = getattr(config, "position_embedding_type", "absolute") or "absolute"
    return "absolute" if kind == "absolute" else "relative"


def bert_like(model: nn.Module) -> list[AttentionSite]:
    """BERT, RoBERTa, XLM-RoBERTa, ELECTRA: ``XSelfAttention``/``XCrossAttention`` + sibling ``output.dense``."""
    sites = []
    for path, parent in model.named_modules():
        inner = getattr(parent, "self", None)
        out = getattr(getattr(parent, "output", None), "dense", None)
        if inner is None or out is None or not all(hasattr(inner, n) for n in ("query", "key", "value")):
            continue
        cross = bool(getattr(parent, "is_cross_attention", False))
        causal = bool(getattr(inner, "is_causal", False))
        heads = inner.num_attention_heads
        sites.append(_linear_site(model, f"{path}.self", inner, inner.query, inner.key, inner.value, out,
                                  heads=heads, kv_heads=heads, head_dim=inner.attention_head_size,
                                  kind="dec-enc" if cross else ("dec-self" if causal else "enc-self"),
                                  positions=_bert_positions(model.config), causal=causal and not cross))
    return sites


def distilbert(model: nn.Module) -> list[AttentionSite]:
    sites = []
    for path, m in model.named_modules():
        if all(hasattr(m, n) for n in ("q_lin", "k_lin", "v_lin", "out_lin")):
            sites.append(_linear_site(model, path, m, m.q_lin, m.k_lin, m.v_lin, m.out_lin,
                                      heads=m.n_heads, kv_heads=m.n_heads, head_dim=m.attention_head_size,
                                      kind="enc-self", positions="absolute", causal=False))
    return sites


def albert(model: nn.Module) -> list[AttentionSite]:
    """ALBERT shares attention modules across layers: one site per module, listing every layer it serves."""
    config = model.config
    n_layers, n_groups = config.num_hidden_layers, config.num_hidden_groups
    sites = []
    for path, m in model.named_modules():
        if not (type(m).__name__ == "AlbertAttention"):
            continue
        group = [int(g) for g in re.findall(r"albert_layer_groups\.(\d+)\.", path)]
        group = group[0] if group else 0
        layers = tuple(layer for layer in range(n_layers) if int(layer / (n_layers / n_groups)) == group)
        sites.append(
            _linear_site(
                model, path, m, m.query, m.key, m.value, m.dense,
                heads=m.num_attention_heads, kv_heads=m.num_attention_heads, head_dim=m.attention_head_size,
                kind="enc-self", positions=_bert_positions(config), causal=False, layers=layers,
                notes=[f"one module shared by layers {layers[0]}-{layers[-1]}: weights and ops apply to all of them"]
                if len(layers) > 1 else [],
            )
        )
    return sites


def gpt2(model: nn.Module) -> list[AttentionSite]:
    """GPT-2: q, k, v fused in ``c_attn`` (a ``Conv1D`` of shape [in, 3·D]); cross attention has ``q_attn``."""
    sites = []
    for path, m in model.named_modules():
        if type(m).__name__ != "GPT2Attention":
            continue
        heads, d, dim = m.num_heads, m.head_dim, m.embed_dim
        cross = bool(m.is_cross_attention)
        width = heads * d  # one section of c_attn (smaller than the hidden size after pruning)
        q_mod, kv_offset = (m.q_attn, 0) if cross else (m.c_attn, width)
        sites.append(AttentionSite(path=path, module=m, family="gpt2", kind="dec-enc" if cross else "dec-self",
                                   layers=(_layer_from(path, m),), num_heads=heads, num_kv_heads=heads, head_dim=d,
                                   hidden_size=dim, positions="absolute", causal=not cross,
                                   q=HeadProjection(q_mod, heads, d, transposed=True),
                                   k=HeadProjection(m.c_attn, heads, d, offset=kv_offset, transposed=True),
                                   v=HeadProjection(m.c_attn, heads, d, offset=kv_offset + width, transposed=True),
                                   o=HeadProjection(m.c_proj, heads, d, axis="in", transposed=True),
                                   notes=["q, k, v fused in c_attn"]))
    return sites


def llama_like(model: nn.Module) -> list[AttentionSite]:
    """Llama, Mistral, Qwen2: separate projections, grouped-query attention, rotary positions."""
    config = model.config
    sites = []
    for path, m in model.named_modules():
        if not all(hasattr(m, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")) or not hasattr(m, "head_dim"):
            continue
        # a collaborative module's q/k projections have the shared width: count heads by its mixing and values
        heads = m.mixing.shape[0] if hasattr(m, "mixing") else m.q_proj.out_features // m.head_dim
        kv_heads = m.v_proj.out_features // m.head_dim
        notes = [f"grouped-query attention: {heads // kv_heads} query heads per key/value head"] if kv_heads < heads else []
        if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
            notes.append(f"sliding window {config.sliding_window}")
        sites.append(_linear_site(model, path, m, m.q_proj, m.k_proj, m.v_proj, m.o_proj,
                                  heads=heads, kv_heads=kv_heads, head_dim=m.head_dim,
                                  kind="dec-self", positions="rotary", causal=True, notes=notes))
    return sites


def vit(model: nn.Module) -> list[AttentionSite]:
    sites = []
    for path, m in model.named_modules():
        if type(m).__name__ == "ViTAttention":
            heads = m.num_attention_heads
            sites.append(_linear_site(model, path, m, m.q_proj, m.k_proj, m.v_proj, m.o_proj,
                                      heads=heads, kv_heads=heads, head_dim=m.head_dim,
                                      kind="enc-self", positions="absolute", causal=False))
    return sites


BERT_LAYOUT = FamilyLayout(head_counts=("num_attention_heads",), head_sizes=("all_head_size",), query="query", key="key",
                           attention_form="bert")
register_adapter(["bert", "roberta", "xlm-roberta", "electra"], bert_like, BERT_LAYOUT)
register_adapter("distilbert", distilbert, FamilyLayout(head_counts=("n_heads",), head_sizes=(), query="q_lin",
                                                        key="k_lin", attention_form="distilbert"))
register_adapter("albert", albert, replace(BERT_LAYOUT, attention_form="albert"))
register_adapter("gpt2", gpt2, FamilyLayout(head_counts=("num_heads",), head_sizes=("split_size",), fused_qkv="c_attn",
                                            cache_policy=True, attention_form="gpt2"))
LLAMA_LAYOUT = FamilyLayout(head_counts=(), head_sizes=(), query="q_proj", key="k_proj", head_dim_in_config=True,
                            kv_conversion=True, cache_policy=True, attention_form="llama")
register_adapter(["llama", "mistral"], llama_like, LLAMA_LAYOUT)
# Qwen2's query/key biases make its scores position-dependent beyond Llama's: a form of its own
register_adapter("qwen2", llama_like, replace(LLAMA_LAYOUT, attention_form="qwen2"))
register_adapter("vit", vit, FamilyLayout(head_counts=("num_attention_heads",), head_sizes=(), query="q_proj",
                                          key="k_proj", attention_form="vit"))
