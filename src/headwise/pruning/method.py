"""What the pruning family's methods do (``headwise.apply``; declared in ``declaration.py``): per-head gates,
fixed masks, L0 gates and physical head removal, which the planner tries at fractions of the heads. The verbs
(``add_gates``, ``apply_masks``, ``add_l0_gates``, ``prune_heads``) stay as shortcuts over the same code."""

from __future__ import annotations

from typing import Any, Sequence

from torch import nn

from ..contract import MethodHooks, register
from ..declaration import Levels, PlanContext
from ..runtime.gates import add_gates, gates_of, remove_gates
from ..runtime.ops import attached
from ..sites import find_sites
from .config import GateConfig, L0Config, MaskConfig, PruneHeadsConfig  # noqa: F401  (their former home)
from .declaration import GATES, L0, MASKS, PRUNE_HEADS
from .l0 import GATE_NAME, add_l0_gates, remove_l0_gates
from .masks import apply_masks, remove_masks
from .ranking import rank
from .surgery import EDIT_KIND, prune_heads, replay_prune_heads


def _first(model: nn.Module):
    return find_sites(model)[0]


def _first_group(model: nn.Module) -> dict[str, list[int]]:
    """The first site's first query head, or its first key/value group under GQA."""
    site = _first(model)
    return {site.name: list(range(site.num_heads // site.num_kv_heads))}


PRUNE_FRACTIONS = (0.0625, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75)  # of the model's heads, removed


def removal(order: Sequence[Sequence[Any]], remove: int) -> dict[str, list[int]]:
    """``{site name: [heads]}`` removing at least ``remove`` query heads, following ``order`` (units
    ``[site name, [heads]]``, least important first)."""
    heads: dict[str, list[int]] = {}
    gone = 0
    for name, unit in order:
        if gone >= remove:
            break
        heads.setdefault(name, []).extend(unit)
        gone += len(unit)
    return {k: sorted(v) for k, v in heads.items()}


def removal_levels(model: nn.Module, context: PlanContext) -> Levels:
    """Heads removed at fixed fractions of the model's heads (and at the budget's head count), by the plan's
    removal order; levels that remove the same number of heads (whole key/value groups) are given once."""
    total = sum(s.num_heads for s in find_sites(model))
    most = sum(len(unit) for _, unit in context.removal_order)
    wanted = {round(f * total) for f in PRUNE_FRACTIONS}
    if context.budget_heads is not None:
        wanted.add(total - context.budget_heads)
    levels, seen = [], set()
    for remove in sorted(w for w in wanted if 0 < w <= most):
        config = PruneHeadsConfig(removal(context.removal_order, remove), context.allow_empty_layers)
        if config.removed not in seen:
            seen.add(config.removed)
            levels.append((f"prune-{total - config.removed}", config))
    return Levels(levels)


@register(GATES)
class Gates(MethodHooks):
    identity = True

    def attach(self, model: nn.Module, config: GateConfig) -> Any:
        return add_gates(model, selection=config.selection)

    def example(self, model: nn.Module) -> GateConfig:
        return GateConfig()

    def detach(self, model: nn.Module) -> None:
        remove_gates(model)

    def present(self, model: nn.Module) -> bool:
        return bool(gates_of(model))


@register(MASKS)
class Masks(MethodHooks):
    identity = True

    def attach(self, model: nn.Module, config: MaskConfig) -> Any:
        return apply_masks(model, config.masks)

    def example(self, model: nn.Module) -> MaskConfig:
        return MaskConfig({_first(model).name: [1] * _first(model).num_heads})

    def detach(self, model: nn.Module) -> None:
        remove_masks(model)

    def present(self, model: nn.Module) -> bool:
        return bool(attached(model, "output", "mask"))


@register(L0)
class L0Gates(MethodHooks):
    identity = True

    def attach(self, model: nn.Module, config: L0Config) -> Any:
        return add_l0_gates(model, config)

    def example(self, model: nn.Module) -> L0Config:
        return L0Config(init=10.0)

    def detach(self, model: nn.Module) -> None:
        remove_l0_gates(model)

    def present(self, model: nn.Module) -> bool:
        return bool(attached(model, "output", GATE_NAME))


@register(PRUNE_HEADS)
class PruneHeads(MethodHooks):
    legacy_kind = EDIT_KIND
    replay = staticmethod(replay_prune_heads)
    levels = staticmethod(removal_levels)
    rank = staticmethod(rank)

    def attach(self, model: nn.Module, config: PruneHeadsConfig) -> Any:
        return prune_heads(model, config.heads, config.allow_empty_layers)

    def example(self, model: nn.Module) -> PruneHeadsConfig:
        return PruneHeadsConfig(_first_group(model))

    def describe(self, config: PruneHeadsConfig) -> str:
        return f"remove {config.removed} heads"

    def at_site(self, config: PruneHeadsConfig, site: str) -> str | None:
        heads = config.heads.get(site)
        return f"removes {', '.join(map(str, heads))}" if heads else None
