"""What KV-cache conversion does under the method contract (declared in ``declaration.py``):
``headwise.apply(model, GQAConfig(kv_heads=1), calibration=batches)`` and ``LatentConfig`` (weights change: not
removable). ``headwise.plan`` tries the GQA merge at the three largest head counts below today's (calibrated)."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..contract import MethodHooks, register
from ..declaration import Levels, PlanContext
from ..sites import find_sites
from .config import GQAConfig, LatentConfig
from .declaration import GQA, LATENT
from .gqa import EDIT_KIND as GQA_KIND, convert_gqa, replay_gqa
from .latent import EDIT_KIND as LATENT_KIND, convert_latent, replay_latent


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


@register(GQA)
class GroupedQuery(MethodHooks):
    meta = False
    legacy_kind = GQA_KIND
    replay = staticmethod(replay_gqa)
    levels = staticmethod(kv_levels)

    def apply(self, model: nn.Module, config: GQAConfig, progress: bool = False, **inputs: Any) -> Any:
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

    def apply(self, model: nn.Module, config: LatentConfig, **inputs: Any) -> Any:
        return convert_latent(model, config=config, progress=False, **inputs)

    def example(self, model: nn.Module) -> LatentConfig:
        return LatentConfig(kv_budget=0.5, init="svd")
