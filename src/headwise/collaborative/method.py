"""Collaborative heads under the method contract: ``headwise.apply(model, CollaborativeConfig(dk=...),
calibration=texts, tokenizer=tok)`` converts in place (weights change: not removable)."""

from __future__ import annotations

from ..contract import register_method
from .apply import compress
from .config import CollaborativeConfig

register_method("collaborative", CollaborativeConfig,
                lambda model, c, **inputs: compress(model, config=c, progress=False, **inputs),
                example=lambda model: CollaborativeConfig(dk=0.5), meta=False)
