"""The compileable per-head cache layer: every buffer preallocated (full groups to ``max_cache_len`` slots, streaming
groups to their whole ``sink + window + 1``), the position held in a tensor, and the one-token step free of host
synchronisation and of Python branches on tensor values, so that ``generate(cache_implementation="static")`` runs
the decoding step under ``torch.compile(fullgraph=True)`` (CUDA graphs on a GPU) without recompiling as the cache
fills. The prefill (several tokens per forward) runs eagerly through ``PolicyLayer``'s code on the same buffers.

A one-token step writes a full group's token to slot ``position`` and attends over all ``max_cache_len`` slots with
the model's mask (built for ``max_cache_len`` keys, as for transformers' ``StaticCache``); a streaming group writes
its ring slot (and, while a row's sinks are still to come, its sink slot) and attends over its fixed slots with a
mask built from positions. Row paddings are read once, in the prefill.
"""

from __future__ import annotations

import torch
from transformers.utils import is_torchdynamo_compiling

from ..errors import HeadwiseError
from ..runtime.attention import GROUPED_KV
from .config import HeadCache
from .layer import Group, GroupedKV, PolicyLayer, _sdpa


class StaticStep(GroupedKV):
    """One token's keys/values ``[B, Hkv, 1, d]`` and its position (a 0-d tensor)."""

    def __init__(self, layer: "StaticPolicyLayer", keys: torch.Tensor, values: torch.Tensor,
                 position: torch.Tensor) -> None:
        super().__init__(layer, keys, values, 0)
        self.position = position

    def attend(self, module, query: torch.Tensor, attention_mask: torch.Tensor | None, scaling: float,
               dropout: float, causal: bool) -> torch.Tensor:
        return self.layer.attend_step(self, query, attention_mask, scaling, dropout if module.training else 0.0)


class StaticPolicyLayer(PolicyLayer):
    """A ``PolicyLayer`` with preallocated buffers and a compileable one-token step (see the module docstring)."""

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

    def _track_padding(self, keep: torch.Tensor | None, batch: int, total: int, device: torch.device) -> None:
        pads = self.pads
        super()._track_padding(keep, batch, total, device)
        self.pads = pads.copy_(self.pads)  # in place: the step reads the address it was compiled with

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Several tokens: the eager prefill (``PolicyLayer.update``); one token: a ``StaticStep``."""
        if key_states.shape[2] > 1 or not self.is_initialized:
            self.seen = 0 if not self.is_initialized else int(self.position)
            if self.seen + key_states.shape[2] > self.max_cache_len:
                raise HeadwiseError(f"{self.seen + key_states.shape[2]} tokens exceed the static cache's "
                                    f"max_cache_len={self.max_cache_len}; generate fewer tokens or a longer cache")
            carriers = super().update(key_states, value_states, *args, **kwargs)
            self.position.add_(key_states.shape[2])
            return carriers
        if key_states.shape[1] != self.num_kv_heads:
            raise HeadwiseError(f"the KV policy has {self.num_kv_heads} KV heads for this layer but the model gives "
                                f"{key_states.shape[1]}; rebuild the policy for this model")
        step = StaticStep(self, key_states, value_states, self.position.clone())
        self.position.add_(1)
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
            write_step(group, k_new, v_new, position, self.pads)
            mask = group.slot_mask(self.pads, position + 1, position.view(1))
            mask = mask | ~mask.any(-1, keepdim=True)  # a row still in its padding sees everything, not NaN
            return _sdpa(q, group.keys, group.values, mask, scaling, dropout, False)

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


def write_step(group: Group, keys: torch.Tensor, values: torch.Tensor, position: torch.Tensor,
               pads: torch.Tensor) -> None:
    """Write one token ``[B, h, 1, d]`` at ``position`` to a streaming group's full-size buffers: its ring slot
    (a token below position ``S`` lands in a slot read as empty until overwritten) and, for the rows whose sink it is,
    its sink slot."""
    sink = group.rule.sink
    if sink:
        hit = (pads[:, None] + torch.arange(sink, device=keys.device)[None] == position)[:, None, :, None]
        for buffer, fresh in ((group.keys, keys), (group.values, values)):
            buffer[:, :, :sink] = torch.where(hit, fresh, buffer[:, :, :sink])
    slot = (sink + torch.remainder(position - sink, group.span)).view(1)
    group.keys.index_copy_(2, slot, keys)
    group.values.index_copy_(2, slot, values)
