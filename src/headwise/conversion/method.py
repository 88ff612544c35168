"""KV-cache conversion under the method contract: ``headwise.apply(model, GQAConfig(kv_heads=1),
calibration=batches)`` and ``LatentConfig`` (weights change: not removable). ``headwise.plan`` tries the GQA merge
at the three largest head counts below today's (calibrated)."""

from __future__ import annotations

from torch import nn

from ..contract import register_method
from ..sites import find_sites
from ..sweep import Levels, Sweep, SweepContext
from .config import GQAConfig, LatentConfig
from .gqa import EDIT_KIND as GQA_KIND, convert_gqa, replay_gqa
from .latent import EDIT_KIND as LATENT_KIND, convert_latent, replay_latent


def kv_levels(model: nn.Module, context: SweepContext) -> Levels:
    """Fewer key/value heads per decoder layer: every count below today's that divides each layer's query
    heads, the three largest."""
    sites = [s for s in find_sites(model) if s.causal and s.kind == "dec-self"]
    if not sites:
        return Levels(why_none="no decoder self-attention")
    now = min(s.num_kv_heads for s in sites)
    options = [k for k in range(now - 1, 0, -1) if all(s.num_heads % k == 0 for s in sites)][:3]
    return Levels([(f"kv-{k}", GQAConfig(kv_heads=k)) for k in options],
                  None if options else "already one key/value head per layer")


register_method("gqa", GQAConfig,
                lambda model, c, progress=False, **inputs: convert_gqa(model, config=c, progress=progress, **inputs),
                example=lambda model: GQAConfig(kv_heads=1, init="mean"), meta=False, replay=replay_gqa,
                legacy_kind=GQA_KIND,
                sweep=Sweep(kv_levels, lambda c: f"{c.kv_heads} KV heads per layer", order=20, role="pair",
                            calibrated=True, label="merge KV heads"))
register_method("latent", LatentConfig,
                lambda model, c, **inputs: convert_latent(model, config=c, progress=False, **inputs),
                example=lambda model: LatentConfig(kv_budget=0.5, init="svd"), meta=False, replay=replay_latent,
                legacy_kind=LATENT_KIND)
