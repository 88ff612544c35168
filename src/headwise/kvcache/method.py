"""Per-head KV cache policies under the method contract: ``headwise.apply(model, KVPolicyConfig(policy))`` (a
``KVPolicy``, its dict, or a ``policy.json`` path). Only ``generate()``'s cache changes; a forward without a cache
computes what it did before."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..contract import MethodConfig, register_method
from ..errors import HeadwiseError
from .apply import KIND, apply_kv_policy, policy_of, remove_kv_policy, replay_kv_policy
from .config import KVPolicy, streaming


@dataclass
class KVPolicyConfig(MethodConfig):
    """The cache of every (layer, KV head): ``policy`` is a ``KVPolicy`` dict (``KVPolicy.to_dict()``) or the path
    of a ``policy.json``."""

    policy: dict[str, Any] | str = field(default_factory=dict, metadata={
        "help": "a KVPolicy dict (KVPolicy.to_dict()) or the path of a policy.json (headwise kv-policy writes one)"})

    def __post_init__(self) -> None:
        if isinstance(self.policy, KVPolicy):
            self.policy = self.policy.to_dict()
        if not self.policy:
            raise HeadwiseError("policy is empty: give a KVPolicy (or its dict), or the path of a policy.json")
        self.whole_model("kv_policy (the policy names every layer and KV head)")


register_method(KIND, KVPolicyConfig, lambda model, c: apply_kv_policy(model, c.policy),
                remove=remove_kv_policy, present=lambda model: policy_of(model) is not None,
                example=lambda model: KVPolicyConfig(KVPolicy.uniform(model, streaming(1, 4))), identity=True,
                replay=replay_kv_policy, legacy_kind=KIND)
