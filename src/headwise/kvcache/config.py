"""``KVPolicyConfig``: the method ``kv_policy``'s config. No torch: the command line reads it to build its options."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..contract import MethodConfig
from ..errors import HeadwiseError


@dataclass
class KVPolicyConfig(MethodConfig):
    """The cache of every (layer, KV head): ``policy`` is a ``KVPolicy`` dict (``KVPolicy.to_dict()``) or the path
    of a ``policy.json``."""

    policy: dict[str, Any] | str = field(default_factory=dict, metadata={
        "help": "a KVPolicy dict (KVPolicy.to_dict()) or the path of a policy.json (headwise kv-policy writes one)"})

    def __post_init__(self) -> None:
        from .policy import KVPolicy

        if isinstance(self.policy, KVPolicy):
            self.policy = self.policy.to_dict()
        if not self.policy:
            raise HeadwiseError("policy is empty: give a KVPolicy (or its dict), or the path of a policy.json")
        self.whole_model("kv_policy (the policy names every layer and KV head)")
