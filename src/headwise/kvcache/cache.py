"""``PolicyCache``: a transformers ``Cache`` whose layers keep, per KV head, what a ``KVPolicy`` says."""

from __future__ import annotations

from transformers.cache_utils import Cache, DynamicLayer

from .config import KVPolicy
from .layer import PolicyLayer


class PolicyCache(Cache):
    """One layer per decoder layer: a plain ``DynamicLayer`` where every head is full (the default cache, exactly),
    a ``PolicyLayer`` elsewhere. Needs the ``headwise`` attention implementation (``apply_kv_policy`` selects it).
    """

    def __init__(self, policy: KVPolicy) -> None:
        layers = [DynamicLayer() if all(c.full for c in rules) else PolicyLayer(rules) for rules in policy.heads]
        super().__init__(layers=layers)
        self.policy = policy

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
