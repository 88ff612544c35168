"""What head mixing does under the method contract (declared in ``declaration.py``): ``headwise.apply(model,
MixingConfig())`` attaches identity mixers."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..contract import MethodHooks, register
from .alpha import add_mixers, mixers_of, remove_mixers
from .config import MixingConfig
from .declaration import MIXING
from .fold import EDIT_KIND, replay_fold


@register(MIXING)
class Mixing(MethodHooks):
    identity = True
    legacy_kind = EDIT_KIND
    replay = staticmethod(replay_fold)

    def attach(self, model: nn.Module, config: MixingConfig) -> Any:
        return add_mixers(model, config)

    def example(self, model: nn.Module) -> MixingConfig:
        return MixingConfig()

    def detach(self, model: nn.Module) -> None:
        remove_mixers(model)

    def present(self, model: nn.Module) -> bool:
        return bool(mixers_of(model))
