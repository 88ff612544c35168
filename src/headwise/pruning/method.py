"""The pruning family's methods under the contract (``headwise.apply``): per-head gates, fixed masks, L0 gates
(``L0Config``) and physical head removal. The verbs (``add_gates``, ``apply_masks``, ``add_l0_gates``,
``prune_heads``) stay as shortcuts over the same code."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ..contract import MethodConfig, register_method
from ..errors import HeadwiseError
from ..runtime.gates import add_gates, gates_of, remove_gates
from ..runtime.ops import attached
from ..sites import find_sites
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
        self.whole_model("prune_heads (its keys select the sites)")


def _first(model: nn.Module):
    return find_sites(model)[0]


def _first_group(model: nn.Module) -> dict[str, list[int]]:
    """The first site's first query head, or its first key/value group under GQA."""
    site = _first(model)
    return {site.name: list(range(site.num_heads // site.num_kv_heads))}


register_method(
    "gates", GateConfig, lambda model, c: add_gates(model, c.sites(model)), remove=remove_gates,
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
    example=lambda model: PruneHeadsConfig(_first_group(model)), replay=replay_prune_heads, legacy_kind=EDIT_KIND)
