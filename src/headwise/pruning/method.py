"""The pruning family's methods under the contract (``headwise.apply``): per-head gates, fixed masks, L0 gates
(``L0Config``) and physical head removal. The verbs (``add_gates``, ``apply_masks``, ``add_l0_gates``,
``prune_heads``) stay as shortcuts over the same code."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from torch import nn

from ..contract import MethodConfig, register_method
from ..errors import HeadwiseError
from ..runtime.gates import add_gates, gates_of, remove_gates
from ..runtime.ops import attached
from ..sites import find_sites
from ..sweep import Levels, Sweep, SweepContext
from .l0 import GATE_NAME, L0Config, add_l0_gates, remove_l0_gates
from .masks import apply_masks, remove_masks
from .surgery import EDIT_KIND, prune_heads, replay_prune_heads


@dataclass
class GateConfig(MethodConfig):
    """A learnable scale per head (``HeadGate``, initialised to 1) on the selected sites."""


@dataclass
class MaskConfig(MethodConfig):
    """Fixed 0/1 head masks: ``masks`` is a ``MaskSpec`` (``{"enc-self.3": [1, 0, ...]}`` or Voita's per-kind
    ``{"enc-self": [[...], ...]}``); the keys are the selection."""

    masks: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "0/1 mask per head, by site ({\"enc-self.3\": [1, 0, ...]}) or per kind, one row per layer "
                "({\"enc-self\": [[...], ...]})"})

    def __post_init__(self) -> None:
        if not isinstance(self.masks, dict) or not self.masks:
            raise HeadwiseError("masks is empty: give at least one site or kind, e.g. {'enc-self.0': [1, 0, 1, ...]}")
        self.whole_model("masks (their keys select the sites)")


@dataclass
class PruneHeadsConfig(MethodConfig):
    """Physical removal of heads: ``heads`` is ``{site name or path: [head indices]}`` (weights shrink for good)."""

    heads: dict[str, list[int]] = field(default_factory=dict, metadata={
        "help": "heads to remove, {site name or path: [head indices]}, e.g. {\"enc-self.0\": [0, 1]}"})
    allow_empty_layers: bool = field(default=False, metadata={
        "help": "allow removing every head of a layer (its attention sublayer then only adds its output bias)"})

    def __post_init__(self) -> None:
        if not isinstance(self.heads, dict) or not self.heads:
            raise HeadwiseError("heads is empty: give {site: [head indices]}, e.g. {'enc-self.0': [3]}")
        bad = next((k for k, v in self.heads.items() if not isinstance(v, list) or not all(
            isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in v)), None)
        if bad is not None:
            raise HeadwiseError(f"heads[{bad!r}] is {self.heads[bad]!r}; give a list of head indices (integers ≥ 0)")
        self.whole_model("prune_heads (its keys select the sites)")

    @property
    def removed(self) -> int:
        return sum(len(h) for h in self.heads.values())


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


def removal_levels(model: nn.Module, context: SweepContext) -> Levels:
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


def _removed_at(config: PruneHeadsConfig, site: str) -> str | None:
    heads = config.heads.get(site)
    return f"removes {', '.join(map(str, heads))}" if heads else None


register_method(
    "gates", GateConfig, lambda model, c: add_gates(model, selection=c.selection), remove=remove_gates,
    present=lambda model: bool(gates_of(model)), example=lambda model: GateConfig(), identity=True)
register_method(
    "masks", MaskConfig, lambda model, c: apply_masks(model, c.masks), remove=remove_masks,
    present=lambda model: bool(attached(model, "output", "mask")),
    example=lambda model: MaskConfig({_first(model).name: [1] * _first(model).num_heads}), identity=True)
register_method(
    "l0", L0Config, lambda model, c: add_l0_gates(model, c), remove=remove_l0_gates,
    present=lambda model: bool(attached(model, "output", GATE_NAME)),
    example=lambda model: L0Config(init=10.0), identity=True, version=2)  # 2: training settings moved to L0Training
register_method(
    "prune_heads", PruneHeadsConfig, lambda model, c: prune_heads(model, c.heads, c.allow_empty_layers),
    example=lambda model: PruneHeadsConfig(_first_group(model)), replay=replay_prune_heads, legacy_kind=EDIT_KIND,
    sweep=Sweep(removal_levels, lambda c: f"remove {c.removed} heads", order=10, role="heads", at_site=_removed_at,
                label="remove heads"))
