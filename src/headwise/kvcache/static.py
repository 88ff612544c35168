"""The compileable per-head cache layer: every buffer preallocated (full groups to ``max_cache_len`` slots, streaming
groups to their whole ``sink + window + 1``), the position held in a tensor, and every forward (a prefill chunk or a
one-token step) free of host synchronisation and of Python branches on tensor values, so that
``generate(cache_implementation="static")`` runs under ``torch.compile(fullgraph=True)`` (CUDA graphs on a GPU)
without recompiling as the cache fills, whatever the prefill chunk (transformers compiles the chunks of a chunked
prefill too).

A forward of ``n`` tokens at tensor position ``p`` (``StaticStep``) writes a full group's tokens to slots
``p .. p + n - 1`` and attends over all ``max_cache_len`` slots with the model's mask (built for ``max_cache_len``
keys, as for transformers' ``StaticCache``). A streaming group: one token writes its ring slot (and, for the rows
whose sink it is, its sink slot) and attends over the fixed slots with a mask built from positions; a chunk attends
over the held slots plus the chunk (masks from positions), then writes its sink tokens and its last ``W + 1`` tokens
to the ring. A token below position ``S`` also lands in a ring slot, which reads as empty until a later token
overwrites it. Row paddings are read from the mask of every chunk.
"""

from __future__ import annotations

import torch
from transformers.utils import is_torchdynamo_compiling

from ..errors import HeadwiseError
from ..runtime.attention import GROUPED_KV, left_padding
from ..runtime.probs import keep_mask
from .policy import HeadCache
from .layer import Group, GroupedKV, PolicyLayer, _sdpa


class StaticStep(GroupedKV):
    """One forward's keys/values ``[B, Hkv, n, d]`` and the position of its first token (a 0-d tensor)."""

    def __init__(self, layer: "StaticPolicyLayer", keys: torch.Tensor, values: torch.Tensor,
                 position: torch.Tensor) -> None:
        super().__init__(layer, keys, values, 0)
        self.position = position

    def attend(self, module, query: torch.Tensor, attention_mask: torch.Tensor | None, scaling: float,
               dropout: float, causal: bool) -> torch.Tensor:
        dropout = dropout if module.training else 0.0
        if query.shape[2] == 1:
            return self.layer.attend_step(self, query, attention_mask, scaling, dropout)
        return self.layer.attend_chunk(self, query, attention_mask, scaling, dropout, causal)


class StaticPolicyLayer(PolicyLayer):
    """A ``PolicyLayer`` with preallocated buffers and compileable forwards (see the module docstring)."""

    is_compileable = True

    def __init__(self, rules: tuple[HeadCache, ...], max_cache_len: int) -> None:
        super().__init__(rules)
        if isinstance(max_cache_len, bool) or not isinstance(max_cache_len, int) or max_cache_len < 1:
            raise HeadwiseError(f"max_cache_len={max_cache_len!r} must be a positive number of tokens")
        self.max_cache_len = max_cache_len
        self.position = torch.tensor(0, dtype=torch.long)  # tokens cached

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        batch = key_states.shape[0]
        for group in self.groups:
            if group.rule.full:
                group.allocate(batch, self.max_cache_len, key_states, zeros=True)
            else:
                group.allocate(batch, group.rule.sink + group.span, key_states, zeros=True)
        self.position = self.position.to(key_states.device)
        self.pads = torch.zeros(batch, dtype=torch.long, device=key_states.device)
        if not is_torchdynamo_compiling():  # fixed addresses: no recompilation, and CUDA graphs may capture them
            for tensor in self.stored_tensors() + [self.position, self.pads]:
                torch._dynamo.mark_static_address(tensor)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Take ``[B, Hkv, n, d]`` keys/values; returns empty carriers holding the ``StaticStep`` of this forward
        (its ``attend`` writes the buffers)."""
        if key_states.shape[1] != self.num_kv_heads:
            raise HeadwiseError(f"the KV policy has {self.num_kv_heads} KV heads for this layer but the model gives "
                                f"{key_states.shape[1]}; rebuild the policy for this model")
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if not is_torchdynamo_compiling() and int(self.position) + key_states.shape[2] > self.max_cache_len:
            raise HeadwiseError(f"{int(self.position) + key_states.shape[2]} tokens exceed the static cache's "
                                f"max_cache_len={self.max_cache_len}; generate fewer tokens or a longer cache")
        step = StaticStep(self, key_states, value_states, self.position.clone())
        self.position.add_(key_states.shape[2])
        carrier_k, carrier_v = key_states[:, :0], value_states[:, :0]
        setattr(carrier_k, GROUPED_KV, step)
        setattr(carrier_v, GROUPED_KV, step)
        return carrier_k, carrier_v

    def attend_step(self, step: StaticStep, query: torch.Tensor, attention_mask: torch.Tensor | None,
                    scaling: float, dropout: float) -> torch.Tensor:
        """One token: ``query [B, Hq, 1, d]`` → ``[B, 1, Hq, d]``, every shape fixed, positions as tensors."""
        position = step.position
        slots = torch.arange(self.max_cache_len, device=query.device)
        full_mask = (slots <= position)[None, None, None] if attention_mask is None else attention_mask

        def attend_group(group: Group, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor) -> torch.Tensor:
            if group.rule.full:
                group.keys.index_copy_(2, position.view(1), k_new)
                group.values.index_copy_(2, position.view(1), v_new)
                return _sdpa(q, group.keys, group.values, full_mask, scaling, dropout, False)
            write_chunk(group, k_new, v_new, position, self.pads)
            mask = group.slot_mask(self.pads, position + 1, position.view(1))
            mask = mask | ~mask.any(-1, keepdim=True)  # a row still in its padding sees everything, not NaN
            return _sdpa(q, group.keys, group.values, mask, scaling, dropout, False)

        return self.each_group(step, query, attend_group)

    def attend_chunk(self, step: StaticStep, query: torch.Tensor, attention_mask: torch.Tensor | None,
                     scaling: float, dropout: float, causal: bool) -> torch.Tensor:
        """A chunk of ``n`` tokens: ``query [B, Hq, n, d]`` → ``[B, n, Hq, d]``; every shape fixed, the positions
        tensors (``q_pos = p .. p + n - 1``)."""
        position, q_len = step.position, query.shape[2]
        q_pos = position + torch.arange(q_len, device=query.device)
        slots = torch.arange(self.max_cache_len, device=query.device)
        keep = keep_mask(attention_mask, q_len, self.max_cache_len, causal, query.device)
        if keep is not None:  # each row's left padding, from the last query's row (it sees every real key)
            self.pads.copy_(left_padding(keep).expand_as(self.pads))
        full_mask = (slots[None] <= q_pos[:, None])[None, None] if attention_mask is None else attention_mask

        def attend_group(group: Group, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor) -> torch.Tensor:
            if group.rule.full:
                group.keys.index_copy_(2, q_pos, k_new)
                group.values.index_copy_(2, q_pos, v_new)
                return _sdpa(q, group.keys, group.values, full_mask, scaling, dropout, False)
            rule = group.rule
            distance = q_pos[:, None] - q_pos[None, :]  # chunk query - chunk key
            key_real = q_pos[None, None, :] - self.pads[:, None, None]  # [B, 1, n]: keys' indices among real tokens
            chunk_ok = (key_real >= 0) & (distance[None] >= 0) & ((key_real < rule.sink)
                                                                  | (distance[None] <= rule.window))
            allowed = torch.cat([group.slot_mask(self.pads, position, q_pos)[:, 0], chunk_ok], -1)
            allowed = allowed | ~allowed.any(-1, keepdim=True)  # a padding query sees everything instead of NaN
            out = _sdpa(q, torch.cat([group.keys, k_new], 2), torch.cat([group.values, v_new], 2), allowed[:, None],
                        scaling, dropout, False)
            write_chunk(group, k_new, v_new, position, self.pads)
            return out

        return self.each_group(step, query, attend_group)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.max_cache_len, 0

    def get_seq_length(self) -> torch.Tensor | int:
        return self.position if self.is_initialized else 0

    def get_max_length(self) -> int:
        return self.max_cache_len

    def reset(self) -> None:
        """Empty the cache in place (the buffers keep their addresses)."""
        for tensor in self.stored_tensors():
            tensor.zero_()
        if self.is_initialized:
            self.position.zero_()
            self.pads.zero_()
        self.seen, self.max_pad = 0, 0

    def crop(self, tokens_to_remove: int) -> None:
        raise HeadwiseError("a static per-head KV cache cannot be cropped (assisted decoding is not supported with a "
                            "KV policy)")


def write_chunk(group: Group, keys: torch.Tensor, values: torch.Tensor, position: torch.Tensor,
                pads: torch.Tensor) -> None:
    """Write ``n`` tokens ``[B, h, n, d]`` (positions ``position ..``) to a streaming group's full-size buffers:
    row ``b``'s real tokens ``0 .. S - 1`` to its sink slots, the last ``min(n, W + 1)`` tokens to their ring slots
    (distinct slots; a token below position ``S`` lands in a slot read as empty until overwritten)."""
    sink, new = group.rule.sink, keys.shape[2]
    if sink:
        source = pads[:, None] + torch.arange(sink, device=keys.device)[None] - position  # [B, S]: chunk index
        inside = ((source >= 0) & (source < new))[:, None, :, None]
        index = source.clamp(0, new - 1)[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[3])
        for buffer, fresh in ((group.keys, keys), (group.values, values)):
            buffer[:, :, :sink] = torch.where(inside, fresh.gather(2, index), buffer[:, :, :sink])
    last = min(new, group.span)
    tokens = position + torch.arange(new - last, new, device=keys.device)
    slots = sink + torch.remainder(tokens - sink, group.span)
    group.keys.index_copy_(2, slots, keys[:, :, new - last:])
    group.values.index_copy_(2, slots, values[:, :, new - last:])
