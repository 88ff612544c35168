"""What per-head KV cache policies do under the method contract (declared in ``declaration.py``):
``headwise.apply(model, KVPolicyConfig(policy))`` (a ``KVPolicy``, its dict, or a ``policy.json`` path). Only
``generate()``'s cache changes; a forward without a cache computes what it did before, so a task's metric is
measured through the policy (``measure_through``: ``policy_forward``). ``headwise.plan`` tries policies that keep
3/4, 1/2 and 1/4 of the cache at the task's sequence length (and the budget's share), the KV heads ranked once by
kv_policy's default ranking; the cost model counts the bytes the cache holds there."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from torch import nn

from ..contract import MethodHooks, register
from ..declaration import AttentionCost, Levels, PlanContext
from ..errors import HeadwiseError
from ..sites import AttentionSite
from .generation import KIND, apply_kv_policy, policy_forward, policy_of, remove_kv_policy, replay_kv_policy
from .choose import DEFAULT_RANKING, kv_policy
from .policy import KVPolicy, model_shape, streaming
from .declaration import KV_POLICY
from .config import KVPolicyConfig

SHARES = (0.75, 0.5, 0.25)  # of the full cache at the task's length, the levels a plan tries
SINK = 4
BUDGET_AXIS = "kv_cache"  # the budget's axis (``planning.Budget``) whose share the levels also try


def policy_levels(model: nn.Module, context: PlanContext) -> Levels:
    """Policies holding each of ``SHARES`` (and the budget's ``kv-cache`` share) of the full cache after a sequence
    of the plan's length, windows scaled to the sequence (``kv_policy``'s default ranking, scores computed once);
    a share the length cannot serve (no window left after the sinks) is left out, saying why when none is left."""
    try:
        model_shape(model)
    except HeadwiseError as err:
        return Levels(why_none=str(err))
    length = max(2, round(context.sequence_length))
    budget = context.budget.get(BUDGET_AXIS)
    shares = sorted(set(SHARES) | ({budget} if budget else set()), reverse=True)
    configs, why, scores = [], [], None
    for share in shares:
        try:
            policy, scores = kv_policy(model, context.tokenizer, share, length, SINK, None, DEFAULT_RANKING,
                                       scores=scores, progress=bool(context.progress))
        except HeadwiseError as err:
            why.append(f"{share:g}: {err}")
            continue
        configs.append((f"kv-policy-{share:g}", KVPolicyConfig(policy)))
    return Levels(configs, None if configs else "; ".join(why))


def describe(config: KVPolicyConfig) -> str:
    policy = KVPolicy.from_dict(config.policy) if isinstance(config.policy, dict) else KVPolicy.load(config.policy)
    kept = sorted({str(c) for layer in policy.heads for c in layer if not c.full})
    return f"KV policy: {len(policy.full_heads())}/{sum(policy.kv_heads)} KV heads full" + (
        f", others {', '.join(kept)}" if kept else "")


def policy_cost(site: AttentionSite, length: float) -> AttentionCost | None:
    """The bytes per token the policy's cache holds at ``site``'s layer after a sequence of ``length`` tokens
    (the policy read from the journal of the config its module holds; None without one)."""
    policy = policy_of(site.module) if getattr(site.module, "config", None) is not None else None
    if policy is None or site.kind != "dec-self":
        return None
    at = max(1, round(length))
    held = sum(rule.stored(at) for rule in policy.heads[site.layer])  # token slots over the layer's KV heads
    return AttentionCost(kv_bytes=2 * site.head_dim * site.k.module.weight.element_size() * held / at)


@register(KV_POLICY)
class KVPolicyHooks(MethodHooks):
    identity = True
    legacy_kind = KIND
    replay = staticmethod(replay_kv_policy)
    levels = staticmethod(policy_levels)
    describe = staticmethod(describe)
    cost = staticmethod(policy_cost)

    def attach(self, model: nn.Module, config: KVPolicyConfig) -> Any:
        return apply_kv_policy(model, config.policy)

    def example(self, model: nn.Module) -> KVPolicyConfig:
        return KVPolicyConfig(KVPolicy.uniform(model, streaming(1, 4)))

    def detach(self, model: nn.Module) -> None:
        remove_kv_policy(model)

    def present(self, model: nn.Module) -> bool:
        return policy_of(model) is not None

    def measure_through(self, model: nn.Module) -> AbstractContextManager | None:
        """Forwards through the policy's cache (``policy_forward``) while the model carries one."""
        return policy_forward(model) if policy_of(model) is not None else None
