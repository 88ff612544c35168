"""One decoder layer of a per-head cache: its KV heads split into groups that share a cache rule, each group in one
buffer ``[B, heads, slots, d]`` that grows with the sequence (never holding more slots than the tokens seen, bar
one growth step).

- A **full** group writes token ``p`` to slot ``p`` of a buffer that, when full, grows to what the forward needs or
  by ``min(held, GROW)`` slots, whichever is more (a copy every ``GROW`` decoding steps, not every step);
  attention reads slots ``0 .. seen - 1`` with the model's own mask, as the default cache does.
- A **streaming** group (sink ``S``, window ``W``) holds at most ``S + R`` slots: ``S`` sink slots (row ``b``'s
  first ``S`` real tokens, i.e. after its left padding) and a ring of ``R`` slots where token ``p ≥ S`` goes to
  slot ``S + (p - S) mod R``, ``R = W + 1`` (the ``+ 1`` is the slot the newest token is written to while the oldest
  one of the window is still visible). Until the ring wraps, token ``p`` sits in slot ``p`` and the buffer grows
  like a full group's, so a short sequence costs no more than the full cache. Keys carry their rotary phase already,
  so slot order does not matter to attention. A decoding query sees every valid slot, so once the ring has wrapped
  past every row's sinks it attends with no mask at all; prefill chunks attend to the held slots plus the chunk with
  a mask built from positions. (A window that scales with the sequence is fixed per cache: ``KVPolicy.at``.)

``update`` cannot return one key tensor (the groups have different lengths): it returns empty carrier tensors that
hold a ``GroupedKV`` (the layer and this forward's new keys/values) under ``runtime.GROUPED_KV``; the ``headwise``
attention function calls its ``attend``, which writes the buffers (it needs the attention mask to find each row's
padding) and runs one SDPA call per group, GQA-aware (query heads reshaped onto their KV head, never repeated keys).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right
from transformers.cache_utils import DynamicLayer

from ..errors import HeadwiseError
from ..runtime.attention import GROUPED_KV, keep_mask, left_padding
from ..runtime.cache_rows import RowOps
from .policy import HeadCache

GROW = 64  # most slots a full group's buffer grows by at once: it holds < min(tokens, GROW) spare slots per head


@dataclass
class Group:
    """KV heads ``heads`` of one layer that share ``rule``; ``keys``/``values`` ``[B, len(heads), slots, d]``."""

    heads: list[int]
    rule: HeadCache
    select: slice | torch.Tensor | None = None  # the heads as an index of the layer's KV heads (None: all of them)
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None

    def pick(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        """The group's heads of ``tensor`` along ``dim`` (a view when they are contiguous)."""
        if self.select is None:
            return tensor
        if isinstance(self.select, slice):
            return tensor[(slice(None),) * dim + (self.select,)]
        return tensor.index_select(dim, self.select.to(tensor.device))

    def allocate(self, batch: int, slots: int, like: torch.Tensor, zeros: bool) -> None:
        shape = (batch, len(self.heads), slots, like.shape[-1])
        make = torch.zeros if zeros else torch.empty
        self.keys = make(shape, dtype=like.dtype, device=like.device)
        self.values = make(shape, dtype=like.dtype, device=like.device)

    # --- full heads ---------------------------------------------------------------------------------------------
    def write_full(self, keys: torch.Tensor, values: torch.Tensor, past: int) -> None:
        """Write ``[B, h, Tq, d]`` at slots ``past .. past + Tq - 1``, growing the buffer when full."""
        total = past + keys.shape[2]
        held = 0 if self.keys is None else self.keys.shape[2]
        if held < total:
            old_k, old_v = self.keys, self.values
            self.allocate(keys.shape[0], max(total, held + min(held, GROW)), keys, zeros=False)
            if old_k is not None and past:
                self.keys[:, :, :past] = old_k[:, :, :past]
                self.values[:, :, :past] = old_v[:, :, :past]
        self.keys[:, :, past:total] = keys
        self.values[:, :, past:total] = values

    # --- sink + window heads ------------------------------------------------------------------------------------
    @property
    def span(self) -> int:
        """Ring slots: the window and the newest token."""
        return self.rule.window + 1

    def ring_positions(self, total: int, device: torch.device) -> torch.Tensor:
        """Position ``[slots - S]`` of the token in each held ring slot after ``total`` tokens (below ``S``: empty)."""
        sink = self.rule.sink
        last = total - 1 - sink  # the newest token's offset past the sinks
        slots = torch.arange(max(0, self.keys.shape[2] - sink), device=device)
        return sink + last - torch.remainder(last - slots, self.span)

    def slot_mask(self, pads: torch.Tensor, total: int, q_pos: torch.Tensor) -> torch.Tensor:
        """Boolean ``[B, 1, Tq, slots]``: the held slots (tokens before ``total``) each query may see."""
        sink = min(self.rule.sink, self.keys.shape[2])
        ring_pos = self.ring_positions(total, q_pos.device)
        ring_ok = (ring_pos[None] - pads[:, None] >= self.rule.sink)[:, None]  # a real token past the row's sinks
        ring_ok = ring_ok & (q_pos[None, :, None] - ring_pos[None, None] <= self.rule.window)
        sink_ok = pads[:, None] + torch.arange(sink, device=q_pos.device)[None] < total  # [B, S]
        sink_ok = sink_ok[:, None].expand(-1, q_pos.shape[0], -1)
        return torch.cat([sink_ok, ring_ok], -1)[:, None]

    def reserve_streaming(self, total: int, like: torch.Tensor) -> None:
        """Grow the buffer to the slots ``total`` tokens fill (``min(total, S + W + 1)``), by at least
        ``min(held, GROW)`` slots at a time; until then the ring has not wrapped, so held tokens keep their slots."""
        held = 0 if self.keys is None else self.keys.shape[2]
        slots = min(total, self.rule.sink + self.span)
        if held < slots:
            old_k, old_v = self.keys, self.values
            self.allocate(like.shape[0], min(self.rule.sink + self.span, max(slots, held + min(held, GROW))), like,
                          zeros=True)  # empty slots are zeros (masked), never NaN
            if held:
                self.keys[:, :, :held] = old_k
                self.values[:, :, :held] = old_v

    def write_streaming(self, keys: torch.Tensor, values: torch.Tensor, past: int, pads: torch.Tensor,
                        sinks_pending: bool) -> None:
        """Write ``[B, h, Tq, d]`` (positions ``past ..``): row ``b``'s real tokens ``0 .. S - 1`` to its sink slots
        (only while ``sinks_pending``), the last ``span`` positions from ``S`` on to the ring."""
        sink, new = self.rule.sink, keys.shape[2]
        total = past + new
        self.reserve_streaming(total, keys)
        if sink and sinks_pending:
            held = min(sink, self.keys.shape[2])
            source = pads[:, None] + torch.arange(held, device=keys.device)[None] - past  # [B, S]
            inside = ((source >= 0) & (source < new))[:, None, :, None]
            index = source.clamp(0, new - 1)[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[3])
            for buffer, fresh in ((self.keys, keys), (self.values, values)):
                buffer[:, :, :held] = torch.where(inside, fresh.gather(2, index), buffer[:, :, :held])
        start = max(0, new - self.span, sink - past)  # tokens below position S live in the sink slots only
        if start >= new:
            return
        if new - start == 1:
            slot = sink + (past + start - sink) % self.span
            self.keys[:, :, slot] = keys[:, :, start]
            self.values[:, :, slot] = values[:, :, start]
        else:
            slots = sink + torch.remainder(torch.arange(past + start - sink, total - sink, device=keys.device),
                                           self.span)
            self.keys.index_copy_(2, slots, keys[:, :, start:])
            self.values.index_copy_(2, slots, values[:, :, start:])


def _sdpa(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, scaling: float,
          dropout: float, causal: bool) -> torch.Tensor:
    """``query [B, h·g, Tq, d]``, ``keys``/``values [B, h, Tk, d]`` → ``[B, h·g, Tq, d]``. One query token: the
    ``g`` query heads of a KV head are its rows (``[B, h, g, d]``), so keys are read once, never repeated."""
    batch, q_heads, q_len, dim = query.shape
    kv_heads = keys.shape[1]
    group = q_heads // kv_heads
    if q_len == 1 and group > 1:
        out = F.scaled_dot_product_attention(query.reshape(batch, kv_heads, group, dim), keys, values, attn_mask=mask,
                                             dropout_p=dropout, scale=scaling)
        return out.reshape(batch, q_heads, 1, dim)
    return F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, dropout_p=dropout, scale=scaling,
                                          is_causal=causal and mask is None and q_len > 1, enable_gqa=group > 1)


@dataclass
class GroupedKV:
    """What attention needs for one layer and one forward: the layer and this forward's new keys/values."""

    layer: "PolicyLayer"
    keys: torch.Tensor  # [B, Hkv, Tq, d]
    values: torch.Tensor
    past: int  # tokens cached before this forward; queries sit at past .. past + Tq - 1

    def attend(self, module, query: torch.Tensor, attention_mask: torch.Tensor | None, scaling: float,
               dropout: float, causal: bool) -> torch.Tensor:
        """``query [B, Hq, Tq, d]`` → ``out [B, Tq, Hq, d]``, each group attending to its own slots."""
        return self.layer.attend(self, query, attention_mask, scaling, dropout if module.training else 0.0, causal)


class PolicyLayer(RowOps, DynamicLayer):
    """A cache layer whose KV heads follow per-head rules (see the module docstring)."""

    is_croppable = False

    def __init__(self, rules: tuple[HeadCache, ...]) -> None:
        super().__init__()
        self.num_kv_heads = len(rules)
        by_rule: dict[HeadCache, list[int]] = {}
        for h, rule in enumerate(rules):
            by_rule.setdefault(rule, []).append(h)
        self.groups = [Group(heads, rule) for rule, heads in sorted(by_rule.items(), key=lambda kv: kv[1][0])]
        self.seen = 0
        self.pads: torch.Tensor | None = None  # [B]: slots before each row's first real token (left padding)
        self.max_pad = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        for group in self.groups:
            heads = group.heads
            if len(heads) == self.num_kv_heads:
                group.select = None
            elif heads == list(range(heads[0], heads[-1] + 1)):
                group.select = slice(heads[0], heads[-1] + 1)
            else:
                group.select = torch.tensor(heads, device=key_states.device)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Take ``[B, Hkv, Tq, d]`` keys/values; returns empty carriers holding the ``GroupedKV`` of this forward
        (the buffers are written by its ``attend``, which sees the attention mask)."""
        if key_states.shape[1] != self.num_kv_heads:
            raise HeadwiseError(f"the KV policy has {self.num_kv_heads} KV heads for this layer but the model gives "
                                f"{key_states.shape[1]}; rebuild the policy for this model")
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        grouped = GroupedKV(self, key_states, value_states, self.seen)
        self.seen += key_states.shape[2]
        # the carriers (and the chunk's keys they hold) live only until this layer's attention ran
        carrier_k, carrier_v = key_states[:, :0], value_states[:, :0]
        setattr(carrier_k, GROUPED_KV, grouped)
        setattr(carrier_v, GROUPED_KV, grouped)
        return carrier_k, carrier_v

    def _track_padding(self, keep: torch.Tensor | None, batch: int, total: int, device: torch.device) -> None:
        """Each row's left padding, read from the last query's row of the model's mask (it sees every real key)."""
        if keep is None:
            if self.pads is None:
                self.pads = torch.zeros(batch, dtype=torch.long, device=device)
            return
        self.pads = left_padding(keep[..., :total]).expand(batch)
        self.max_pad = 0 if device.type == "meta" else int(self.pads.max())

    def attend(self, grouped: GroupedKV, query: torch.Tensor, attention_mask: torch.Tensor | None, scaling: float,
               dropout: float, causal: bool) -> torch.Tensor:
        """Write the forward's keys/values and attend: ``query [B, Hq, Tq, d]`` → ``[B, Tq, Hq, d]``."""
        batch, q_len = query.shape[0], query.shape[2]
        past, total = grouped.past, grouped.past + q_len
        if attention_mask is not None and attention_mask.shape[-1] < total:
            raise HeadwiseError(f"attention mask covers {attention_mask.shape[-1]} keys but {total} tokens are "
                                "cached; build the mask from this cache (get_mask_sizes)")
        decoding = q_len == 1 and past > 0
        if q_len > 1 or past <= self.max_pad:  # a row may still be padding: (re)read it from the model's mask
            keep = None if attention_mask is None else keep_mask(attention_mask, q_len, total, causal, query.device)
            self._track_padding(keep, batch, total, query.device)
        full_mask = None if attention_mask is None else attention_mask[..., :total]
        if full_mask is None and causal and q_len > 1 and past > 0:  # SDPA's is_causal is top-left aligned
            full_mask = causal_lower_right(q_len, total)  # no tensor: SDPA's fused kernels take the offset

        def attend_group(group: Group, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor) -> torch.Tensor:
            if group.rule.full:
                group.write_full(k_new, v_new, past)
                return _sdpa(q, group.keys[:, :, :total], group.values[:, :, :total], full_mask, scaling, dropout,
                             causal)
            return self._attend_streaming(group, q, k_new, v_new, past, decoding, scaling, dropout)

        return self.each_group(grouped, query, attend_group)

    def each_group(self, grouped: GroupedKV, query: torch.Tensor, attend_group) -> torch.Tensor:
        """``attend_group(group, q [B, h·g, Tq, d], keys [B, h, Tq, d], values) -> [B, h·g, Tq, d]`` for every
        group (``h`` of its KV heads, ``g`` query heads each), gathered into ``[B, Tq, Hq, d]``."""
        batch, q_heads, q_len, dim = query.shape
        group_size = q_heads // self.num_kv_heads
        by_head = query.view(batch, self.num_kv_heads, group_size, q_len, dim)
        out = None
        for group in self.groups:
            q = group.pick(by_head, 1).reshape(batch, len(group.heads) * group_size, q_len, dim)
            o = attend_group(group, q, group.pick(grouped.keys, 1), group.pick(grouped.values, 1))
            if len(self.groups) == 1:
                return o.transpose(1, 2)
            if out is None:
                out = query.new_empty(batch, q_len, self.num_kv_heads, group_size, dim)
            o = o.view(batch, len(group.heads), group_size, q_len, dim).permute(0, 3, 1, 2, 4)
            if isinstance(group.select, torch.Tensor):
                out.index_copy_(2, group.select, o)
            else:
                out[:, :, group.select] = o
        return out.view(batch, q_len, q_heads, dim)

    def _attend_streaming(self, group: Group, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                          past: int, decoding: bool, scaling: float, dropout: float) -> torch.Tensor:
        rule = group.rule
        q_len, total = keys.shape[2], past + keys.shape[2]
        sinks_pending = past < self.max_pad + rule.sink
        if decoding:  # write first: the query sees every valid slot, the newest included
            group.write_streaming(keys, values, past, self.pads, sinks_pending)
            clean = past >= self.max_pad + rule.sink + rule.window  # every slot holds a real token past the sinks
            mask = None
            if not clean:
                mask = group.slot_mask(self.pads, total, torch.arange(past, total, device=keys.device))
                mask = mask | ~mask.any(-1, keepdim=True)  # a row still in its padding sees everything, not NaN
            return self.attend_window(group, query, group.keys, group.values, mask, scaling, dropout)
        q_pos = torch.arange(past, total, device=keys.device)
        distance = q_pos[:, None] - q_pos[None, :]  # chunk query - chunk key
        key_real = q_pos[None, None, :] - self.pads[:, None, None]  # [B, 1, Tq]: keys' indices among real tokens
        chunk_ok = (key_real >= 0) & (distance[None] >= 0) & ((key_real < rule.sink) | (distance[None] <= rule.window))
        if past:
            held_ok = group.slot_mask(self.pads, past, q_pos)[:, 0]
            allowed = torch.cat([held_ok, chunk_ok], -1)
            keys, values = torch.cat([group.keys, keys], 2), torch.cat([group.values, values], 2)
        else:
            allowed = chunk_ok
        allowed = allowed | ~allowed.any(-1, keepdim=True)  # a padding query sees everything instead of NaN
        o = self.attend_window(group, query, keys, values, allowed[:, None], scaling, dropout)
        group.write_streaming(keys[:, :, keys.shape[2] - q_len:], values[:, :, values.shape[2] - q_len:], past,
                              self.pads, sinks_pending)
        return o

    def attend_window(self, group: Group, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                      mask: torch.Tensor | None, scaling: float, dropout: float) -> torch.Tensor:
        """A streaming group's attention over the slots it may see: ``query [B, h·g, Tq, d]``, ``keys``/``values
        [B, h, Tk, d]``, ``mask`` boolean ``[B, 1, Tq|1, Tk]`` (None: every slot) → ``[B, h·g, Tq, d]``."""
        return _sdpa(query, keys, values, mask, scaling, dropout, False)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    def get_seq_length(self) -> int:
        return self.seen

    def stored_tensors(self) -> list[torch.Tensor]:
        return [t for g in self.groups for t in (g.keys, g.values) if t is not None]

    def reset(self) -> None:
        for group in self.groups:
            group.keys = group.values = None
        self.seen, self.pads, self.max_pad = 0, None, 0
        self.keys = self.values = None
        self.is_initialized = False

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove == 0:
            return
        if tokens_to_remove > 0:
            raise HeadwiseError(f"crop({tokens_to_remove}): pass a negative number of tokens to remove")
        if any(not g.rule.full and self.seen - g.rule.sink > g.span for g in self.groups):
            raise HeadwiseError("a per-head KV cache cannot be cropped once streaming heads dropped tokens "
                                "(assisted decoding is not supported with a KV policy)")
        self.seen += tokens_to_remove  # slots past `seen` are ignored (full) or read as empty (ring, sinks)

    def _each(self, fn) -> None:
        for group in self.groups:
            if group.keys is not None:
                group.keys, group.values = fn(group.keys), fn(group.values)
        if self.pads is not None:
            self.pads = fn(self.pads)


    def offload(self) -> None:
        self._each(lambda t: t.to("cpu", non_blocking=True))

    def prefetch(self) -> None:
        if self.is_initialized:
            self._each(lambda t: t.to(self.device, non_blocking=True))
