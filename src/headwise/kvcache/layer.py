"""One decoder layer of a per-head cache: its KV heads split into groups that share a cache rule, each group one
dense tensor ``[B, heads, stored, d]`` (full heads grow; sink + window heads hold at most ``S + W`` tokens).

``update`` cannot return one key tensor (the groups have different lengths): it returns an empty carrier tensor
that holds a ``GroupedKV`` under ``runtime.GROUPED_KV``; the ``headwise`` attention function calls its ``attend``,
which runs attention per group with the group's own mask and scatters the outputs back to the query heads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from ..errors import HeadwiseError
from ..runtime.attention import GROUPED_KV, keep_mask
from .config import HeadCache


@dataclass
class Group:
    """KV heads ``heads`` of one layer that share ``rule``; ``keys``/``values`` ``[B, len(heads), stored, d]``."""

    heads: list[int]
    rule: HeadCache
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None

    def stored_positions(self, seen: int, device: torch.device) -> torch.Tensor:
        """Absolute positions ``[stored]`` of the tokens held after ``seen`` tokens."""
        cap = self.rule.capacity
        if cap is None or seen <= cap:
            return torch.arange(seen, device=device)
        sink, window = self.rule.sink, self.rule.window
        return torch.cat([torch.arange(sink, device=device), torch.arange(seen - window, seen, device=device)])

    def trim(self, keys: torch.Tensor, seen: int) -> torch.Tensor:
        """The slots to keep from ``keys`` ``[B, h, n, d]`` (positions ``stored_positions(seen - new) + new``)."""
        cap = self.rule.capacity
        if cap is None or keys.shape[2] <= cap:
            return keys
        return torch.cat([keys[:, :, : self.rule.sink], keys[:, :, keys.shape[2] - self.rule.window :]], dim=2)


@dataclass
class GroupedKV:
    """What attention needs for one layer and one forward: the visible keys/values of every group."""

    groups: list[tuple[Group, torch.Tensor, torch.Tensor, torch.Tensor | None]]  # group, keys, values, positions
    num_kv_heads: int
    past: int  # tokens cached before this forward; queries sit at past .. past + Tq - 1

    def attend(self, module, query: torch.Tensor, attention_mask: torch.Tensor | None, scaling: float,
               dropout: float, causal: bool) -> torch.Tensor:
        """``query [B, Hq, Tq, d]`` → ``out [B, Tq, Hq, d]``, each group attending to its own keys."""
        batch, num_heads, q_len, _ = query.shape
        group_size = num_heads // self.num_kv_heads
        out = None
        q_pos = torch.arange(self.past, self.past + q_len, device=query.device)
        total = self.past + q_len
        keep = None
        if attention_mask is not None:
            if attention_mask.shape[-1] < total:
                raise HeadwiseError(f"attention mask covers {attention_mask.shape[-1]} keys but {total} tokens are "
                                    "cached; build the mask from this cache (get_mask_sizes)")
            keep = keep_mask(attention_mask, q_len, total, causal, query.device)
        for group, keys, values, k_pos in self.groups:
            q_heads = torch.tensor([h * group_size + r for h in group.heads for r in range(group_size)],
                                   device=query.device)
            q = query.index_select(1, q_heads)
            if k_pos is None:  # full heads: the model's own mask, as without a policy
                o, _ = sdpa_attention_forward(module, q, keys, values, attention_mask, dropout=dropout,
                                              scaling=scaling, is_causal=causal)
            else:
                o, _ = sdpa_attention_forward(module, q, keys, values, self.mask(group.rule, q_pos, k_pos, keep),
                                              dropout=dropout, scaling=scaling, is_causal=False)
            if out is None:
                out = o.new_empty(batch, q_len, num_heads, o.shape[-1])
            out.index_copy_(2, q_heads, o)
        return out

    @staticmethod
    def mask(rule: HeadCache, q_pos: torch.Tensor, k_pos: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        """Boolean ``[B|1, 1, Tq, n]``: causal, a sink or within the window, and allowed by the model's mask."""
        distance = q_pos[:, None] - k_pos[None, :]
        allowed = (distance >= 0) & ((k_pos[None, :] < rule.sink) | (distance <= rule.window))
        allowed = allowed[None, None]
        if keep is not None:
            allowed = allowed & keep.index_select(-1, k_pos)
        # a query with nothing visible (a padding position) looks at every kept key instead of producing NaN
        return allowed | ~allowed.any(-1, keepdim=True)


class PolicyLayer(DynamicLayer):
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

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Add ``[B, Hkv, Tq, d]`` keys/values; returns empty carriers holding the ``GroupedKV`` of this forward."""
        if key_states.shape[1] != self.num_kv_heads:
            raise HeadwiseError(f"the KV policy has {self.num_kv_heads} KV heads for this layer but the model gives "
                                f"{key_states.shape[1]}; rebuild the policy for this model")
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        past, new = self.seen, key_states.shape[2]
        self.seen += new
        visible = []
        for group in self.groups:
            index = torch.tensor(group.heads, device=key_states.device)
            k_new, v_new = key_states.index_select(1, index), value_states.index_select(1, index)
            keys = k_new if group.keys is None else torch.cat([group.keys, k_new], dim=2)
            values = v_new if group.values is None else torch.cat([group.values, v_new], dim=2)
            positions = None
            if not group.rule.full:
                positions = torch.cat([group.stored_positions(past, key_states.device),
                                       torch.arange(past, self.seen, device=key_states.device)])
            visible.append((group, keys, values, positions))
            # cat/index_select allocate: the stored tensors never share a larger buffer
            group.keys, group.values = group.trim(keys, self.seen), group.trim(values, self.seen)
        # the carriers (and the prompt-long visible keys they hold) live only until this layer's attention ran
        grouped = GroupedKV(visible, self.num_kv_heads, past)
        carrier_k, carrier_v = key_states[:, :0], value_states[:, :0]
        setattr(carrier_k, GROUPED_KV, grouped)
        setattr(carrier_v, GROUPED_KV, grouped)
        self.keys, self.values = self.groups[0].keys, self.groups[0].values
        return carrier_k, carrier_v

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    def get_seq_length(self) -> int:
        return self.seen

    def stored_tensors(self) -> list[torch.Tensor]:
        return [t for g in self.groups for t in (g.keys, g.values) if t is not None]

    def reset(self) -> None:
        for group in self.groups:
            group.keys = group.values = None
        self.seen = 0
        self.keys = self.values = None
        self.is_initialized = False

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove == 0:
            return
        if tokens_to_remove > 0:
            raise HeadwiseError(f"crop({tokens_to_remove}): pass a negative number of tokens to remove")
        if any(g.rule.capacity is not None and self.seen > g.rule.capacity for g in self.groups):
            raise HeadwiseError("a per-head KV cache cannot be cropped once streaming heads dropped tokens "
                                "(assisted decoding is not supported with a KV policy)")
        for group in self.groups:
            group.keys, group.values = group.keys[:, :, :tokens_to_remove], group.values[:, :, :tokens_to_remove]
        self.seen += tokens_to_remove

    def _each(self, fn) -> None:
        for group in self.groups:
            if group.keys is not None:
                group.keys, group.values = fn(group.keys), fn(group.values)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._each(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._each(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._each(lambda t: t[indices])

    def offload(self) -> None:
        self._each(lambda t: t.to("cpu", non_blocking=True))

    def prefetch(self) -> None:
        if self.is_initialized:
            self._each(lambda t: t.to(self.device, non_blocking=True))
