"""KV-cache conversion under the method contract: ``headwise.apply(model, GQAConfig(kv_heads=1),
calibration=batches)`` and ``LatentConfig`` (weights change: not removable)."""

from __future__ import annotations

from ..contract import register_method
from .config import GQAConfig, LatentConfig
from .gqa import EDIT_KIND as GQA_KIND, convert_gqa, replay_gqa
from .latent import EDIT_KIND as LATENT_KIND, convert_latent, replay_latent

register_method("gqa", GQAConfig, lambda model, c, **inputs: convert_gqa(model, config=c, progress=False, **inputs),
                example=lambda model: GQAConfig(kv_heads=1, init="mean"), meta=False, replay=replay_gqa,
                legacy_kind=GQA_KIND)
register_method("latent", LatentConfig,
                lambda model, c, **inputs: convert_latent(model, config=c, progress=False, **inputs),
                example=lambda model: LatentConfig(kv_budget=0.5, init="svd"), meta=False, replay=replay_latent,
                legacy_kind=LATENT_KIND)
