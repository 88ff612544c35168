"""What per-head KV cache policies do under the method contract (declared in ``declaration.py``):
``headwise.apply(model, KVPolicyConfig(policy))`` (a ``KVPolicy``, its dict, or a ``policy.json`` path). Only
``generate()``'s cache changes; a forward without a cache computes what it did before."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..contract import MethodHooks, register
from .apply import KIND, apply_kv_policy, policy_of, remove_kv_policy, replay_kv_policy
from .config import KVPolicy, streaming
from .declaration import KV_POLICY
from .policy_config import KVPolicyConfig


@register(KV_POLICY)
class KVPolicyHooks(MethodHooks):
    identity = True
    legacy_kind = KIND
    replay = staticmethod(replay_kv_policy)

    def apply(self, model: nn.Module, config: KVPolicyConfig) -> Any:
        return apply_kv_policy(model, config.policy)

    def example(self, model: nn.Module) -> KVPolicyConfig:
        return KVPolicyConfig(KVPolicy.uniform(model, streaming(1, 4)))

    def remove(self, model: nn.Module) -> None:
        remove_kv_policy(model)

    def present(self, model: nn.Module) -> bool:
        return policy_of(model) is not None
