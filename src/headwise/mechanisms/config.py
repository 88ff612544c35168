"""``ReplaceConfig``: the method ``replace``'s config (an efficient mechanism and its arguments at the selected
sites). No torch: the command line reads it to build its options; the mechanism's name is checked against the
registry when a config is made."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..contract import MethodConfig


@dataclass
class ReplaceConfig(MethodConfig):
    """An efficient attention ``mechanism`` (a name of ``list_mechanisms()``) with its ``args``."""

    mechanism: str = field(default="softmax", metadata={
        "help": "an efficient attention mechanism: a name of headwise mechanisms list"})
    args: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "the mechanism's arguments, e.g. {\"window\": 16} (headwise mechanisms list shows each one's)"})

    def __post_init__(self) -> None:
        from .base import get_mechanism

        get_mechanism(self.mechanism)  # an unknown name raises, listing the known ones
