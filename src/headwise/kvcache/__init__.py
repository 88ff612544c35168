"""Per-head KV cache policies: full or sink + window per (layer, KV head), stored physically smaller, used by
``model.generate()`` unchanged. See docs/kv-policy.md."""

from .apply import apply_kv_policy, policy_cache, policy_forward, policy_of, remove_kv_policy
from .cache import PolicyCache
from .baselines import BASELINES, equal_bytes_policies, streaming_policy
from .choose import full_heads_for_budget, kv_policy, rank_kv_heads
from .config import FULL, HeadCache, KVPolicy, streaming
from .gates import KVGate, add_kv_gates, kv_gate_values, remove_kv_gates
from .learn import KVGateConfig, LearnedGates
from .passkey import passkey_prompts
from .scores import HeadScores, ScoreConfig, head_scores

from .method import KVPolicyConfig  # registers the method
__all__ = [
    "KVPolicyConfig",
    "apply_kv_policy", "policy_cache", "policy_forward", "policy_of", "remove_kv_policy", "PolicyCache", "FULL", "HeadCache",
    "KVPolicy", "streaming", "full_heads_for_budget", "kv_policy", "rank_kv_heads", "passkey_prompts", "HeadScores",
    "ScoreConfig", "head_scores", "KVGate", "add_kv_gates", "kv_gate_values", "remove_kv_gates", "KVGateConfig",
    "LearnedGates", "BASELINES", "equal_bytes_policies", "streaming_policy",
]
