"""What collaborative heads do under the method contract (declared in ``declaration.py``): ``headwise.apply(model,
CollaborativeConfig(dk=...), calibration=texts, tokenizer=tok)`` converts in place (weights change: not
removable). ``headwise.plan`` tries widths that are shares of each site's heads × head dim (after heads removed, of
the heads left); the cost model counts the scores at the shared width."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..contract import MethodHooks, register
from ..declaration import AttentionCost, Levels, PlanContext
from ..sites import AttentionSite, find_sites
from .compression import EDIT_KIND, compress, replay_collaborative
from .config import CollaborativeConfig
from .declaration import COLLABORATIVE
from .families import is_collaborative

DK_FRACTIONS = (0.75, 0.5, 0.375, 0.25, 0.125)


def width_levels(model: nn.Module, context: PlanContext) -> Levels:
    return Levels([(f"dk-{f:g}", CollaborativeConfig(dk=f)) for f in DK_FRACTIONS])


def describe(config: CollaborativeConfig) -> str:
    dk = config.dk
    return f"collaborative heads dk={100 * dk:g}% of the heads' width" if isinstance(dk, float) and dk < 1 \
        else f"collaborative heads dk={dk}"


def calibration_tokens(model: nn.Module) -> int:
    """Real tokens the data-aware objective needs: the hidden size (fewer leave the input covariances singular)."""
    return max((s.hidden_size for s in find_sites(model)), default=0)


@register(COLLABORATIVE)
class Collaborative(MethodHooks):
    meta = False
    legacy_kind = EDIT_KIND
    replay = staticmethod(replay_collaborative)
    levels = staticmethod(width_levels)
    describe = staticmethod(describe)
    calibration_tokens = staticmethod(calibration_tokens)

    def attach(self, model: nn.Module, config: CollaborativeConfig, progress: bool = False, **inputs: Any) -> Any:
        return compress(model, config=config, progress=progress, **inputs)

    def example(self, model: nn.Module) -> CollaborativeConfig:
        return CollaborativeConfig(dk=0.5)

    def cost(self, site: AttentionSite, length: float) -> AttentionCost | None:
        """Scores over the shared width ``R`` (``mixing [H, R]``), plus one content tag per head unless rotary."""
        if not is_collaborative(site.module):
            return None
        heads, width = site.module.mixing.shape
        return AttentionCost(score_width=width + (0 if hasattr(site.module, "frequencies") else heads))
