"""Head mixing under the method contract: ``headwise.apply(model, MixingConfig())`` attaches identity mixers."""

from __future__ import annotations

from ..contract import register_method
from .alpha import add_mixers, mixers_of, remove_mixers
from .config import MixingConfig
from .fold import EDIT_KIND, replay_fold

register_method("mixing", MixingConfig, lambda model, c: add_mixers(model, c), remove=remove_mixers,
                present=lambda model: bool(mixers_of(model)), example=lambda model: MixingConfig(), identity=True,
                replay=replay_fold, legacy_kind=EDIT_KIND,
                version=2)  # 2: training settings moved to NuclearNormTraining
