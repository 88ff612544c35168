"""``PolicyCache``: a transformers ``Cache`` whose layers keep, per KV head, what a ``KVPolicy`` says."""

from __future__ import annotations

from transformers.cache_utils import Cache, DynamicLayer, StaticLayer

from .policy import KVPolicy
from .layer import PolicyLayer
from .static import StaticPolicyLayer


class PolicyCache(Cache):
    """One layer per decoder layer: a plain ``DynamicLayer`` where every head is full (the default cache, exactly),
    a ``PolicyLayer`` elsewhere. With ``max_cache_len`` every buffer is preallocated and the cache is compileable:
    ``StaticLayer`` (transformers' static cache, exactly) and ``StaticPolicyLayer``. ``length``: the tokens the cache
    is built for, which fixes the windows that scale with the sequence (``KVPolicy.at``; None: their caps). Needs
    the ``headwise`` attention implementation (``apply_kv_policy`` selects it)."""

    def __init__(self, policy: KVPolicy, max_cache_len: int | None = None, length: int | None = None) -> None:
        rules = policy.at(length).heads
        if max_cache_len is None:
            layers = [DynamicLayer() if all(c.full for c in layer) else PolicyLayer(layer) for layer in rules]
        else:
            layers = [StaticLayer(max_cache_len) if all(c.full for c in layer)
                      else StaticPolicyLayer(layer, max_cache_len) for layer in rules]
        super().__init__(layers=layers)
        self.policy = policy
        self.max_cache_len, self.length = max_cache_len, length

    def stored_bytes(self) -> int:
        """Bytes of the key/value storage the cache holds now (every tensor's whole buffer: a head's tokens, or a
        streaming head's ``sink + window + 1`` slots once its ring is complete, plus fewer than
        ``min(tokens, layer.GROW)`` spare slots)."""
        total = 0
        for layer in self.layers:
            tensors = layer.stored_tensors() if isinstance(layer, PolicyLayer) else [
                t for t in (layer.keys, layer.values) if t is not None]
            total += sum(t.untyped_storage().nbytes() for t in tensors)
        return total
