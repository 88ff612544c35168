"""``LatentCache``: a transformers ``Cache`` that holds what a latent site (``convert_latent``) caches per token —
its latent ``c`` ``[r]`` and its rotary key rows ``[2·G·p]`` — never the decoded keys/values.

Per decoder layer with a latent site, a ``LatentLayer`` keeps ``latent [B, slots, r]`` and ``rope [B, G, slots, 2p]``
(the rotary rows as the attention module rotated them), in buffers that grow by ``min(held, GROW)`` slots when
full. Its ``update`` returns empty carriers holding a ``LatentKV`` under ``runtime.GROUPED_KV``; the ``headwise``
attention function calls its ``attend``:

- **decoding** (one query token): keys are decoded from the latent (``c·U_k`` per KV head, then the rotary
  embedding of each slot's position, the rotary rows put back) — the decoded key rows carry the rotary embedding,
  so ``U_k`` cannot move into the query (see docs/kv-cache.md); the **values are never decoded**: the attention
  weights read the latent (``p·C``, ``[Hq, r]``) and ``U_v`` of each query head's KV head maps the result to
  ``[d]`` (``Σ_s p_s U_v c_s = U_v Σ_s p_s c_s``).
- **prefill** (several query tokens): the forward's own keys/values, after the held tokens' decoded ones.

The positions of the held tokens (one ``[B, slots]`` row shared by every layer) give the rotary phase; the cos/sin
table for them is rebuilt once per forward (by the first layer that needs it) with the model's rotary module.
The latent of the forward's tokens reaches the layer from its ``v_proj`` (``take_latent``: a projection keeps its
latest latent only while a latent cache for it lives).
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from ..compat import CACHE, cache_given
from ..errors import HeadwiseError
from ..runtime import NAME, enable
from ..runtime.attention import GROUPED_KV
from ..runtime.cache_rows import RowOps
from ..sites import find_sites
from .layer import LatentProjection, take_latent, watch_latent

GROW = 16  # most slots a buffer grows by at once (a copy every 16 steps): < min(tokens, GROW) spare slots
HOOK = "_prepare_cache_for_generation"


def _grow(buffer: torch.Tensor | None, shape: tuple[int, ...], dim: int, like: torch.Tensor) -> torch.Tensor:
    """``buffer`` with at least ``shape[dim]`` slots along ``dim`` (a copy when it grows; ``like``'s dtype and
    device), new slots uninitialised."""
    held, total = 0 if buffer is None else buffer.shape[dim], shape[dim]
    if held >= total:
        return buffer
    size = list(shape)
    size[dim] = max(total, held + min(held, GROW))
    grown = torch.empty(size, dtype=like.dtype, device=like.device)
    if held:
        grown.narrow(dim, 0, held).copy_(buffer)
    return grown


def _rotate_columns(keys: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding (rotate-half layout) of keys stored as columns, ``keys [B, G, d, T]``, with ``cos``/``sin``
    ``[B, 1, d, T]``: ``k·cos + rotate_half(k)·sin`` as transformers computes it, without a concatenation."""
    half = keys.shape[2] // 2
    k1, k2 = keys[:, :, :half], keys[:, :, half:]
    out = torch.empty_like(keys)
    torch.mul(k1, cos[:, :, :half], out=out[:, :, :half]).addcmul_(k2, sin[:, :, :half], value=-1)
    torch.mul(k2, cos[:, :, half:], out=out[:, :, half:]).addcmul_(k1, sin[:, :, half:])
    return out


class Positions:
    """The position of every held token ``[B, slots]`` (shared by the layers) and the cos/sin table for them."""

    def __init__(self, rotary: nn.Module | None) -> None:
        self.rotary = rotary
        self.ids: torch.Tensor | None = None
        self.seen = 0
        self.table: tuple[int, torch.Tensor, torch.Tensor] | None = None

    def write(self, position_ids: torch.Tensor | None, batch: int, past: int, new: int, device: torch.device) -> None:
        if self.seen >= past + new:
            return
        if position_ids is None:
            position_ids = torch.arange(past, past + new, device=device)[None]
        position_ids = position_ids.expand(batch, new)
        self.ids = _grow(self.ids, (batch, past + new), 1, position_ids)
        self.ids[:, past:past + new] = position_ids
        self.seen = past + new

    def cos_sin(self, total: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos``, ``sin`` ``[B, 1, d, total]`` of the held positions ``0 .. total - 1``."""
        if self.table is None or self.table[0] != total:
            cos, sin = self.rotary(like, self.ids[:, :total])  # [B, total, d]
            self.table = (total, cos.transpose(1, 2)[:, None], sin.transpose(1, 2)[:, None])
        return self.table[1], self.table[2]


@dataclass
class LatentKV:
    """What attention needs for one latent layer and one forward."""

    layer: "LatentLayer"
    keys: torch.Tensor  # [B, G, Tq, d], rotated
    values: torch.Tensor  # [B, G, Tq, d]
    past: int

    def attend(self, module: nn.Module, query: torch.Tensor, attention_mask: torch.Tensor | None, scaling: float,
               dropout: float, causal: bool) -> torch.Tensor:
        """``query [B, Hq, Tq, d]`` → ``out [B, Tq, Hq, d]``."""
        return self.layer.attend(self, query, attention_mask, scaling, dropout if module.training else 0.0, causal)


class LatentLayer(RowOps, DynamicLayer):
    """The cache of one latent site (see the module docstring)."""

    is_croppable = False

    def __init__(self, attention: nn.Module, positions: Positions) -> None:
        super().__init__()
        self.k_proj: LatentProjection = attention.k_proj
        self.v_proj: LatentProjection = attention.v_proj
        self.head_dim = attention.head_dim
        self.kv_heads = self.k_proj.out_features // self.head_dim
        self.positions = positions
        self.latent: torch.Tensor | None = None  # [B, slots, r]
        self.rope: torch.Tensor | None = None  # [B, G, slots, 2p]
        self.seen = 0
        per_head = self.k_proj.rope_rows // self.kv_heads
        if self.k_proj.order.is_meta:  # no data to read the rows from: any rows of the right count (shapes only)
            self.rope_dims = torch.arange(per_head).expand(self.kv_heads, per_head)
        else:
            is_rope = (self.k_proj.order < self.k_proj.rope_rows).view(self.kv_heads, self.head_dim)
            self.rope_dims = is_rope.nonzero()[:, 1].view(self.kv_heads, per_head)  # [G, 2p]: each head's rotary rows
        watch_latent(self.v_proj, self)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Take ``[B, G, Tq, d]`` rotated keys and values (and the latent ``v_proj`` just computed); store the latent
        and the rotary rows; return empty carriers holding the ``LatentKV`` of this forward."""
        latent = take_latent(self.v_proj)
        batch, _, new, _ = key_states.shape
        if latent is None or latent.shape[:2] != (batch, new):
            raise HeadwiseError("the latent cache did not receive this layer's latent (its v_proj is not the "
                                "LatentProjection the cache was built for): build it with latent_cache(model)")
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        past, total = self.seen, self.seen + new
        forward_kwargs = kwargs.get("kwargs") or kwargs.get("cache_kwargs") or {}
        self.positions.write(forward_kwargs.get("position_ids"), batch, past, new, key_states.device)
        self.latent = _grow(self.latent, (batch, total, latent.shape[-1]), 1, latent)
        self.latent[:, past:total] = latent
        if self.rope_dims.shape[1]:
            index = self.rope_dims.to(key_states.device)[None, :, None].expand(batch, -1, new, -1)
            rope = key_states.gather(-1, index)
            self.rope = _grow(self.rope, (batch, self.kv_heads, total, rope.shape[-1]), 2, rope)
            self.rope[:, :, past:total] = rope
        self.seen = total
        grouped = LatentKV(self, key_states, value_states, past)
        carrier_k, carrier_v = key_states[:, :, :0], value_states[:, :, :0]
        setattr(carrier_k, GROUPED_KV, grouped)
        setattr(carrier_v, GROUPED_KV, grouped)
        return carrier_k, carrier_v

    def key_columns(self, count: int) -> torch.Tensor:
        """Keys of held tokens ``0 .. count - 1`` as columns ``[B, G, d, count]``: decoded from the latent (one
        GEMM), rotated, the rotary rows put back."""
        batch = self.latent.shape[0]
        keys = (self.k_proj.head_rows() @ self.latent[:, :count].transpose(1, 2))  # [B, G·d, count]
        keys = keys.view(batch, self.kv_heads, self.head_dim, count)
        if self.positions.rotary is not None:
            cos, sin = self.positions.cos_sin(count, keys)
            keys = _rotate_columns(keys, cos, sin)
        if self.rope_dims.shape[1]:
            index = self.rope_dims.to(keys.device)[None, :, :, None].expand(batch, -1, -1, count)
            keys = keys.scatter(2, index, self.rope[:, :, :count].transpose(2, 3))
        return keys

    def attend(self, grouped: LatentKV, query: torch.Tensor, attention_mask: torch.Tensor | None, scaling: float,
               dropout: float, causal: bool) -> torch.Tensor:
        batch, q_heads, q_len, dim = query.shape
        past, total = grouped.past, grouped.past + q_len
        mask = None if attention_mask is None else attention_mask[..., :total]
        if q_len == 1 and past > 0:
            return self._decode(query, mask, scaling, total)
        keys, values = grouped.keys, grouped.values
        if past:
            held_values = (self.latent[:, :past] @ self.v_proj.head_rows().T).view(batch, past, self.kv_heads, dim)
            keys = torch.cat([self.key_columns(past).transpose(2, 3), keys], 2)
            values = torch.cat([held_values.transpose(1, 2), values], 2)
            if mask is None and causal:  # SDPA's is_causal is top-left aligned
                q_pos = torch.arange(past, total, device=query.device)
                mask = (torch.arange(total, device=query.device)[None] <= q_pos[:, None])[None, None]
        out = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, dropout_p=dropout, scale=scaling,
                                             is_causal=causal and mask is None and q_len > 1,
                                             enable_gqa=q_heads != self.kv_heads)
        return out.transpose(1, 2)

    def _decode(self, query: torch.Tensor, mask: torch.Tensor | None, scaling: float, total: int) -> torch.Tensor:
        """One query token: scores on decoded keys, values read through the latent. ``→ [B, 1, Hq, d]``."""
        batch, q_heads, _, dim = query.shape
        group = q_heads // self.kv_heads
        scores = query.view(batch, self.kv_heads, group, dim) @ self.key_columns(total) * scaling
        if mask is not None:  # [B|1, 1, 1, total]
            scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)  # [B, G, g, total]
        mixed = probs.view(batch, 1, q_heads, total) @ self.latent[:, None, :total]  # [B, 1, Hq, r]
        up_v = self.v_proj.head_rows().view(self.kv_heads, dim, -1).transpose(1, 2)  # [G, r, d]
        out = mixed.view(batch, self.kv_heads, group, -1) @ up_v  # [B, G, g, d]
        return out.reshape(batch, 1, q_heads, dim)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    def get_seq_length(self) -> int:
        return self.seen

    def stored_tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.latent, self.rope) if t is not None]

    def reset(self) -> None:
        self.latent = self.rope = None
        self.seen = 0
        self.positions.seen, self.positions.table = 0, None
        self.is_initialized = False

    def crop(self, tokens_to_remove: int) -> None:
        raise HeadwiseError("a latent KV cache cannot be cropped (assisted decoding is not supported with it)")

    def _each(self, fn) -> None:
        self.latent = None if self.latent is None else fn(self.latent)
        self.rope = None if self.rope is None else fn(self.rope)


def _rotary_module(model: nn.Module) -> nn.Module | None:
    found = [m for name, m in model.named_modules() if name.split(".")[-1] == "rotary_emb"]
    return found[0] if found else None


def latent_sites(model: nn.Module) -> dict[int, nn.Module]:
    """The attention modules of ``model``'s latent decoder self-attentions, by ``layer_idx``."""
    return {site.module.layer_idx: site.module for site in find_sites(model)
            if site.kind == "dec-self" and isinstance(getattr(site.module, "k_proj", None), LatentProjection)
            and getattr(site.module, "layer_idx", None) is not None}


class LatentCache(Cache):
    """One layer per decoder layer: a ``LatentLayer`` at each latent site, a plain ``DynamicLayer`` elsewhere.
    Needs the ``headwise`` attention implementation; ``convert_latent`` selects it and makes ``generate`` use this
    cache."""

    def __init__(self, model: nn.Module) -> None:
        sites = latent_sites(model)
        if not sites:
            raise HeadwiseError(f"{type(model).__name__} has no latent key/value site; convert it with "
                                "headwise.convert_latent first")
        if any(getattr(m, "k_norm", None) is not None for m in sites.values()):
            raise HeadwiseError("a latent cache cannot decode keys that go through a k_norm after the projection; "
                                "generate with the default cache")
        layers_count = model.config.get_text_config().num_hidden_layers
        self.positions = Positions(_rotary_module(model))
        layers = [LatentLayer(sites[i], self.positions) if i in sites else DynamicLayer()
                  for i in range(layers_count)]
        super().__init__(layers=layers)

    def _positions(self, fn) -> None:
        if self.positions.ids is not None:
            self.positions.ids = fn(self.positions.ids)
        self.positions.table = None

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        self._positions(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        self._positions(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        self._positions(lambda t: t[indices])

    def stored_bytes(self) -> int:
        """Bytes of the key/value storage held now: latents and rotary rows (whole buffers, spare slots included)
        at latent layers, keys and values elsewhere."""
        total = 0
        for layer in self.layers:
            tensors = layer.stored_tensors() if isinstance(layer, LatentLayer) else [
                t for t in (layer.keys, layer.values) if t is not None]
            total += sum(t.untyped_storage().nbytes() for t in tensors)
        return total


def latent_cache(model: nn.Module) -> LatentCache:
    """A fresh ``LatentCache`` for plain forward calls: ``model(ids, cache=latent_cache(model), use_cache=True)``
    (``past_key_values=`` before transformers 5.24). ``generate`` builds one by itself on a latent model."""
    if model.config._attn_implementation != NAME:
        raise HeadwiseError(f"a latent KV cache needs the headwise attention implementation, not "
                            f"{model.config._attn_implementation!r}: call headwise.enable(model)")
    return LatentCache(model)


def _prepare_latent_cache(self, generation_config, model_kwargs: dict, *args, **kwargs):
    """``generate``'s cache preparation, then the default ``DynamicCache`` swapped for a ``LatentCache``."""
    user_cache = cache_given(model_kwargs)
    result = type(self)._prepare_cache_for_generation(self, generation_config, model_kwargs, *args, **kwargs)
    if not user_cache and type(model_kwargs.get(CACHE)) is DynamicCache:
        model_kwargs[CACHE] = latent_cache(self)
    return result


def use_latent_cache(model: nn.Module) -> None:
    """Make ``model.generate()`` hold latents (a decoder-only model with latent sites, no ``k_norm``); other
    models keep the default cache. Selects the ``headwise`` attention implementation."""
    sites = latent_sites(model)
    if not sites or not hasattr(type(model), HOOK) or any(getattr(m, "k_norm", None) is not None
                                                          for m in sites.values()):
        return
    enable(model)
    setattr(model, HOOK, types.MethodType(_prepare_latent_cache, model))
