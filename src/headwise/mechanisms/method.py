"""Attention replacement under the method contract: ``headwise.apply(model, ReplaceConfig("performer",
{"features": 64}))`` runs a mechanism at the selected sites with the pretrained q/k/v/o weights."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..contract import MethodConfig, register_method
from .base import get_mechanism
from .dropin import apply, mechanisms_of, remove


@dataclass
class ReplaceConfig(MethodConfig):
    """An efficient attention ``mechanism`` (a name of ``list_mechanisms()``) with its ``args``."""

    mechanism: str = field(default="softmax", metadata={
        "help": "an efficient attention mechanism: a name of headwise mechanisms list"})
    args: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "the mechanism's arguments, e.g. {\"window\": 16} (headwise mechanisms list shows each one's)"})

    def __post_init__(self) -> None:
        get_mechanism(self.mechanism)  # an unknown name raises, listing the known ones


register_method("mechanism", ReplaceConfig,
                lambda model, c: apply(model, c.mechanism, sites=c.sites(model), **c.args),
                remove=remove, present=lambda model: bool(mechanisms_of(model)),
                example=lambda model: ReplaceConfig("softmax"), identity=True)
