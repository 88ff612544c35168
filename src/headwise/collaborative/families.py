"""Converting a family's attention module into a collaborative one, in place.

The module object stays (its hooks, its place in the model, ``isinstance`` checks such as transformers'
``output_attentions`` recorder all keep working); its query/key projections are replaced by the shared
``W~q``/``W~k`` of width ``R`` under the same attribute names, ``mixing`` and ``content_bias`` are added, and
its class becomes a subclass of both ``CollaborativeAttention`` and the family class whose ``forward`` (same
signature as the family's; the cache is read under either keyword, ``headwise.compat``) scores collaboratively.
The subclass keeps the family class name, which is how the site adapters recognise ALBERT, GPT-2 and ViT modules.
"""

from __future__ import annotations

from typing import Callable

import torch
from einops import rearrange
from torch import nn
from transformers.cache_utils import EncoderDecoderCache
from transformers.pytorch_utils import Conv1D

from ..compat import pop_cache
from ..errors import HeadwiseError
from ..runtime.dispatch import set_class
from ..sites import AttentionSite
from .decompose import Factors
from .layer import CollaborativeAttention, RotaryCollaborativeAttention
from .rotary import RotaryFactors


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    return rearrange(x, "b t (h d) -> b h t d", h=heads)


def _self_cache(cache):
    return cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache


def _bert_forward(self, hidden_states, attention_mask=None, **kwargs):
    past_key_values = pop_cache(kwargs)
    query, key = self.collaborative_qk(self.query(hidden_states), self.key(hidden_states), hidden_states)
    value = _heads(self.value(hidden_states), self.mixing.shape[0])
    if past_key_values is not None:
        key, value = _self_cache(past_key_values).update(key, value, self.layer_idx)
    return self.attend(query, key, value, attention_mask, self.dropout.p if self.training else 0.0, **kwargs)


def _albert_forward(self, hidden_states, attention_mask=None, **kwargs):
    query, key = self.collaborative_qk(self.query(hidden_states), self.key(hidden_states), hidden_states)
    value = _heads(self.value(hidden_states), self.mixing.shape[0])
    out, probs = self.attend(query, key, value, attention_mask,
                             self.attention_dropout.p if self.training else 0.0, **kwargs)
    return self.LayerNorm(hidden_states + self.output_dropout(self.dense(out))), probs


def _distilbert_forward(self, hidden_states, attention_mask=None, **kwargs):
    query, key = self.collaborative_qk(self.q_lin(hidden_states), self.k_lin(hidden_states), hidden_states)
    value = _heads(self.v_lin(hidden_states), self.mixing.shape[0])
    out, probs = self.attend(query, key, value, attention_mask, self.dropout.p if self.training else 0.0, **kwargs)
    return self.out_lin(out), probs


def _vit_forward(self, hidden_states, attention_mask=None, **kwargs):
    query, key = self.collaborative_qk(self.q_proj(hidden_states), self.k_proj(hidden_states), hidden_states)
    value = _heads(self.v_proj(hidden_states), self.mixing.shape[0])
    out, probs = self.attend(query, key, value, attention_mask, self.attention_dropout if self.training else 0.0,
                             **kwargs)
    return self.o_proj(out), probs


def _gpt2_forward(self, hidden_states, attention_mask=None, encoder_hidden_states=None, encoder_attention_mask=None,
                  output_attentions=False, **kwargs):
    past_key_values = pop_cache(kwargs)
    if encoder_hidden_states is not None:
        raise HeadwiseError("collaborative GPT-2 attention is self-attention only; cross-attention was not converted")
    rank = self.mixing.shape[1]
    q, k, v = self.c_attn(hidden_states).split([rank, rank, v_width(self)], dim=2)
    query, key = self.collaborative_qk(q, k, hidden_states)
    value = _heads(v, self.mixing.shape[0])
    if past_key_values is not None:
        key, value = _self_cache(past_key_values).update(key, value, self.layer_idx)
    out, probs = self.attend(query, key, value, attention_mask, self.attn_dropout.p if self.training else 0.0,
                             output_attentions=output_attentions, **kwargs)
    return self.resid_dropout(self.c_proj(out)), probs


def _bart_forward(self, hidden_states, key_value_states=None, attention_mask=None, **kwargs):
    """Self- and cross-attention: in cross-attention (``key_value_states``: the encoder's output) the query comes
    from the decoder and the shared key and the values from the encoder; an ``EncoderDecoderCache`` keeps them
    after the first decoding step, as the family's forward does."""
    past_key_values = pop_cache(kwargs)
    cross = key_value_states is not None
    source = key_value_states if cross else hidden_states
    cache = past_key_values.cross_attention_cache if cross and isinstance(past_key_values, EncoderDecoderCache) \
        else None if cross else past_key_values
    if cross and cache is not None and past_key_values.is_updated.get(self.layer_idx):
        key, value = cache.layers[self.layer_idx].keys, cache.layers[self.layer_idx].values
    else:
        key = self.collaborative_key(self.k_proj(source), source)
        value = _heads(self.v_proj(source), self.mixing.shape[0])
        if cache is not None:
            key, value = (cache if cross else _self_cache(cache)).update(key, value, self.layer_idx)
            if cross:
                past_key_values.is_updated[self.layer_idx] = True
    query = self.collaborative_query(self.q_proj(hidden_states))
    out, probs = self.attend(query, key, value, attention_mask, self.dropout if self.training else 0.0, **kwargs)
    return self.out_proj(out), probs


def _t5_forward(self, hidden_states, mask=None, key_value_states=None, position_bias=None, **kwargs):
    """T5: as the family's forward, the position bias is computed here when the stack has not passed one yet
    (layer 0) and returned, so the next layers reuse it; the bias is additive and content-free, so the
    collaborative scores plus the bias equal the original scores plus the bias."""
    if key_value_states is not None:
        raise HeadwiseError("collaborative T5 attention is self-attention only; cross-attention was not converted")
    past_key_values = pop_cache(kwargs)
    query, key = self.collaborative_qk(self.q(hidden_states), self.k(hidden_states), hidden_states)
    value = _heads(self.v(hidden_states), self.mixing.shape[0])
    past = 0
    if past_key_values is not None:
        past = past_key_values.get_seq_length(self.layer_idx)
        past = past.clone() if isinstance(past, torch.Tensor) else past
        key, value = _self_cache(past_key_values).update(key, value, self.layer_idx)
    if position_bias is None:
        q_len, k_len = hidden_states.shape[1], key.shape[2]
        position_bias = self.compute_bias(q_len, k_len, query.device, past) if self.has_relative_attention_bias \
            else torch.zeros(1, self.n_heads, q_len, k_len, device=query.device, dtype=query.dtype)
    out, probs = self.attend(query, key, value, mask, self.dropout if self.training else 0.0,
                             position_bias=position_bias, **kwargs)
    return self.o(out), position_bias, probs


def _llama_forward(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
    """Llama, Mistral: the shared query and key are rotated plane by plane (``rotary_qk``); the cache stores the
    one shared key and the ``G`` grouped values; the attention function repeats them for the ``H`` query heads."""
    past_key_values = pop_cache(kwargs)
    cos, sin = position_embeddings
    query, key = self.rotary_qk(self.q_proj(hidden_states), self.k_proj(hidden_states), cos, sin)
    value = _heads(self.v_proj(hidden_states), self.v_proj.out_features // self.head_dim)  # pruning may remove groups
    if past_key_values is not None:
        key, value = past_key_values.update(key, value, self.layer_idx)
    if getattr(self.config, "sliding_window", None) is not None:  # Mistral
        kwargs["sliding_window"] = self.config.sliding_window
    out, probs = self.attend(query, key, value, attention_mask, self.attention_dropout if self.training else 0.0,
                             **kwargs)
    return self.o_proj(out), probs


def v_width(module: nn.Module) -> int:
    """Width of GPT-2's value section in the fused ``c_attn`` ``[q̃ (R) | k̃ (R) | v (H·d)]``."""
    return module.c_attn.nf - 2 * module.mixing.shape[1]


# The collaborative forward of each attention form (``site.layout.attention_form``); which attributes hold the
# projections is the rest of the family's layout (headwise.sites). Rotary sites (``site.positions == "rotary"``)
# are converted with shared rotation planes (``headwise.collaborative.rotary``).
FORWARDS: dict[str, Callable] = {"bert": _bert_forward, "albert": _albert_forward, "distilbert": _distilbert_forward,
                                 "vit": _vit_forward, "gpt2": _gpt2_forward, "bart": _bart_forward, "t5": _t5_forward,
                                 "llama": _llama_forward}
# Forms whose collaborative forward also runs cross-attention (query from the decoder, key from the encoder).
CROSS_ATTENTION_FORMS = ("bart",)
_CLASSES: dict[type, type] = {}


def collaborative_class(base: type, forward: Callable, mixin: type = CollaborativeAttention) -> type:
    """``mixin`` (``CollaborativeAttention`` or its rotary form) × ``base`` with the family's ``forward`` (one
    class per family class)."""
    if base not in _CLASSES:
        _CLASSES[base] = type(base.__name__, (mixin, base), {
            "forward": forward, "family_class": base, "__module__": __name__,
            "__qualname__": f"Collaborative{base.__name__}", "__doc__": CollaborativeAttention.__doc__,
        })
    return _CLASSES[base]


def is_collaborative(module: nn.Module) -> bool:
    return isinstance(module, CollaborativeAttention)


def _linear(weight: torch.Tensor) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        layer.weight.copy_(weight)
    return layer


def install_rotary(site: AttentionSite, rank: int, factors: RotaryFactors | None = None) -> None:
    """Make the rotary ``site.module`` collaborative with width ``rank`` (even); without ``factors`` (replaying
    a checkpoint) the new parameters and the ``frequencies`` buffer are left for the state dict."""
    module, layout, ref = site.module, site.layout, site.v.module.weight
    like = {"dtype": ref.dtype, "device": ref.device}
    if factors is None:
        query = key = torch.zeros(rank, site.hidden_size, **like)
        mixing = torch.zeros(site.num_heads, rank, **like)
        frequencies = torch.zeros(rank // 2, dtype=torch.long, device=ref.device)
    else:
        (query, key, mixing), frequencies = factors.real_weights(ref.dtype), factors.frequencies.to(ref.device)
    setattr(module, layout.query, _linear(query.to(ref.device)).train(module.training))
    setattr(module, layout.key, _linear(key.to(ref.device)).train(module.training))
    module.mixing = nn.Parameter(mixing.to(ref.device))
    module.register_buffer("frequencies", frequencies)
    set_class(module, collaborative_class(type(module), FORWARDS[site.layout.attention_form],
                                          RotaryCollaborativeAttention))


def install(site: AttentionSite, rank: int, factors: Factors | None = None,
            content: torch.Tensor | None = None) -> None:
    """Make ``site.module`` collaborative with width ``rank``. ``factors``/``content`` (``[H, D]``) give the
    weights; without them (replaying a checkpoint) the new parameters are left for the state dict."""
    if site.positions == "rotary":
        install_rotary(site, rank, factors)
        return
    layout = site.layout
    module, heads, dim = site.module, site.num_heads, site.hidden_size
    ref = site.v.module.weight
    like = {"dtype": ref.dtype, "device": ref.device}
    if factors is None:
        factors = Factors(torch.zeros(heads, rank, **like), torch.zeros(dim, rank, **like),
                          torch.zeros(dim, rank, **like))
        content = torch.zeros(heads, dim, **like)
    query, key = factors.query.T.to(**like), factors.key.T.to(**like)  # [R, D]
    if layout.fused_qkv:  # GPT-2: c_attn becomes [q̃ | k̃ | v]; the query bias starts at 0 (the key bias cancels)
        value_w, value_b = site.v.weight.detach().flatten(0, 1), site.v.bias.detach().flatten()
        with torch.device(ref.device):  # Conv1D takes no device argument
            fused = Conv1D(2 * rank + value_w.shape[0], dim).to(ref.dtype)
        with torch.no_grad():
            fused.weight.copy_(torch.cat([query, key, value_w]).T)
            fused.bias.copy_(torch.cat([torch.zeros(2 * rank, **like), value_b]))
        setattr(module, layout.fused_qkv, fused.train(module.training))
    else:
        setattr(module, layout.query, _linear(query).train(module.training))
        setattr(module, layout.key, _linear(key).train(module.training))
    module.mixing = nn.Parameter(factors.mixing.to(**like))
    module.content_bias = _linear(content.to(**like)).train(module.training)
    set_class(module, collaborative_class(type(module), FORWARDS[site.layout.attention_form]))
