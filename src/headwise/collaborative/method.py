"""Collaborative heads under the method contract: ``headwise.apply(model, CollaborativeConfig(dk=...),
calibration=texts, tokenizer=tok)`` converts in place (weights change: not removable). ``headwise.plan`` tries
widths that are shares of each site's heads × head dim (after heads removed, of the heads left)."""

from __future__ import annotations

from torch import nn

from ..contract import register_method
from ..sweep import Levels, Sweep, SweepContext
from .apply import EDIT_KIND, compress, replay_collaborative
from .config import CollaborativeConfig

DK_FRACTIONS = (0.75, 0.5, 0.375, 0.25, 0.125)


def width_levels(model: nn.Module, context: SweepContext) -> Levels:
    return Levels([(f"dk-{f:g}", CollaborativeConfig(dk=f)) for f in DK_FRACTIONS])


def describe(config: CollaborativeConfig) -> str:
    dk = config.dk
    return f"collaborative heads dk={100 * dk:g}% of the heads' width" if isinstance(dk, float) and dk < 1 \
        else f"collaborative heads dk={dk}"


register_method("collaborative", CollaborativeConfig,
                lambda model, c, progress=False, **inputs: compress(model, config=c, progress=progress, **inputs),
                example=lambda model: CollaborativeConfig(dk=0.5), meta=False, replay=replay_collaborative,
                legacy_kind=EDIT_KIND,
                sweep=Sweep(width_levels, describe, order=30, role="pair", calibrated=True,
                            label="collaborative heads"))
