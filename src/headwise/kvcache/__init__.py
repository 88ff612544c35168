"""Per-head KV cache policies: full or sink + window per (layer, KV head), stored physically smaller, used by
``model.generate()`` unchanged. See docs/kv-policy.md.

The names load on first use (``headwise.lazy``): ``.config`` and ``.declaration`` import without torch."""

from typing import TYPE_CHECKING

from ..lazy import attach as _lazy

if TYPE_CHECKING:
    from .generation import apply_kv_policy, policy_cache, policy_forward, policy_of, remove_kv_policy
    from .baselines import BASELINES, equal_bytes_policies, streaming_policy
    from .cache import PolicyCache
    from .choose import full_heads_for_budget, kv_policy, rank_kv_heads
    from .policy import FULL, HeadCache, KVPolicy, streaming
    from .gates import KVGate, add_kv_gates, kv_gate_values, remove_kv_gates
    from .learn import KVGateConfig, LearnedGates
    from .method import KVPolicyHooks  # registers the method
    from .passkey import passkey_prompts
    from .config import KVPolicyConfig
    from .scores import HeadScores, ScoreConfig, head_scores

__getattr__, __dir__ = _lazy(__name__, globals())
__all__ = [
    "KVPolicyConfig",
    "apply_kv_policy", "policy_cache", "policy_forward", "policy_of", "remove_kv_policy", "PolicyCache", "FULL",
    "HeadCache", "KVPolicy", "streaming", "full_heads_for_budget", "kv_policy", "rank_kv_heads", "passkey_prompts",
    "HeadScores", "ScoreConfig", "head_scores", "KVGate", "add_kv_gates", "kv_gate_values", "remove_kv_gates",
    "KVGateConfig", "LearnedGates", "BASELINES", "equal_bytes_policies", "streaming_policy",
]
