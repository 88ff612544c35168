"""Per-head KV cache policies: full or sink + window per (layer, KV head), stored physically smaller, used by
``model.generate()`` unchanged. See docs/kv-policy.md."""

from .apply import apply_kv_policy, policy_cache, policy_of, remove_kv_policy
from .cache import PolicyCache
from .config import FULL, HeadCache, KVPolicy, streaming

__all__ = [
    "apply_kv_policy", "policy_cache", "policy_of", "remove_kv_policy", "PolicyCache", "FULL", "HeadCache",
    "KVPolicy", "streaming",
]
