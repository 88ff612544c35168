"""Collaborative heads under the method contract: ``headwise.apply(model, CollaborativeConfig(dk=...),
calibration=texts, tokenizer=tok)`` converts in place (weights change: not removable)."""

from __future__ import annotations

from ..contract import register_method
from .apply import EDIT_KIND, compress, replay_collaborative
from .config import CollaborativeConfig

register_method("collaborative", CollaborativeConfig,
                lambda model, c, **inputs: compress(model, config=c, progress=False, **inputs),
                example=lambda model: CollaborativeConfig(dk=0.5), meta=False, replay=replay_collaborative,
                legacy_kind=EDIT_KIND)
