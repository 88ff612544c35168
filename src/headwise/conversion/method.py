"""What KV-cache conversion does under the method contract (declared in ``declaration.py``):
``headwise.apply(model, GQAConfig(kv_heads=1), calibration=batches)`` and ``LatentConfig`` (weights change: not
removable). ``headwise.plan`` tries the GQA merge at the three largest head counts below today's and latent
keys/values at 1/2 and 1/4 of today's cache (and the budget's share), both calibrated; the cost model counts a
latent site's cache as its latent and rotary rows."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..contract import MethodHooks, register
from ..declaration import AttentionCost, Levels, PlanContext
from ..errors import HeadwiseError
from ..sites import AttentionSite, find_sites
from .checks import convertible_sites
from .config import GQAConfig, LatentConfig
from .declaration import GQA, LATENT
from .gqa import EDIT_KIND as GQA_KIND, convert_gqa, replay_gqa
from .latent import EDIT_KIND as LATENT_KIND, convert_latent, replay_latent
from .layer import LatentProjection

LATENT_SHARES = (0.5, 0.25)  # of today's KV cache, the latent widths a plan tries
BUDGET_AXIS = "kv_cache"  # the budget's axis (``planning.Budget``) whose share the latent levels also try


def kv_levels(model: nn.Module, context: PlanContext) -> Levels:
    """Fewer key/value heads per decoder layer: every count below today's that divides each layer's query
    heads, the three largest."""
    sites = [s for s in find_sites(model) if s.causal and s.kind == "dec-self"]
    if not sites:
        return Levels(why_none="no decoder self-attention")
    now = min(s.num_kv_heads for s in sites)
    options = [k for k in range(now - 1, 0, -1) if all(s.num_heads % k == 0 for s in sites)][:3]
    return Levels([(f"kv-{k}", GQAConfig(kv_heads=k)) for k in options],
                  None if options else "already one key/value head per layer")


def calibration_tokens(model: nn.Module) -> int:
    """Real tokens per site a calibrated fit needs: the hidden size (fewer leave the input moments singular)."""
    return max((s.hidden_size for s in find_sites(model) if s.kind == "dec-self"), default=0)


def latent_levels(model: nn.Module, context: PlanContext) -> Levels:
    """Latent keys/values keeping ``LATENT_SHARES`` (and the budget's ``kv-cache`` share) of today's cache."""
    try:
        convertible_sites(model, "latent keys/values")
    except HeadwiseError as err:
        return Levels(why_none=str(err))
    budget = context.budget.get(BUDGET_AXIS)
    shares = sorted(set(LATENT_SHARES) | ({budget} if budget else set()), reverse=True)
    return Levels([(f"latent-{share:g}", LatentConfig(kv_budget=share)) for share in shares])


def latent_cost(site: AttentionSite, length: float) -> AttentionCost | None:
    """A latent site caches its latent and its rotary key rows per token (``LatentCache``), not keys and values."""
    k = getattr(site.module, "k_proj", None)
    if not isinstance(k, LatentProjection):
        return None
    return AttentionCost(kv_bytes=(k.rank + k.rope_rows) * k.down.weight.element_size())


@register(GQA)
class GroupedQuery(MethodHooks):
    meta = False
    legacy_kind = GQA_KIND
    replay = staticmethod(replay_gqa)
    levels = staticmethod(kv_levels)
    calibration_tokens = staticmethod(calibration_tokens)

    def attach(self, model: nn.Module, config: GQAConfig, progress: bool = False, **inputs: Any) -> Any:
        return convert_gqa(model, config=config, progress=progress, **inputs)

    def example(self, model: nn.Module) -> GQAConfig:
        return GQAConfig(kv_heads=1, init="mean")

    def describe(self, config: GQAConfig) -> str:
        return f"{config.kv_heads} KV heads per layer"


@register(LATENT)
class Latent(MethodHooks):
    meta = False
    legacy_kind = LATENT_KIND
    replay = staticmethod(replay_latent)
    levels = staticmethod(latent_levels)
    cost = staticmethod(latent_cost)
    calibration_tokens = staticmethod(calibration_tokens)

    def attach(self, model: nn.Module, config: LatentConfig, progress: bool = False, **inputs: Any) -> Any:
        return convert_latent(model, config=config, progress=progress, **inputs)

    def example(self, model: nn.Module) -> LatentConfig:
        return LatentConfig(kv_budget=0.5, init="svd")

    def describe(self, config: LatentConfig) -> str:
        width = f"{config.kv_budget:.0%} of today's KV cache" if config.kv_budget is not None else \
            f"rank {config.rank}"
        return f"latent keys/values at {width}"
