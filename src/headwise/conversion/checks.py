"""What a conversion refuses, checked before anything changes."""

from __future__ import annotations

from torch import nn

from ..errors import HeadwiseError
from ..runtime.dispatch import refuse_offloaded
from ..runtime.ops import ops_of
from ..sites import AttentionSite, families_with, family_layout, find_sites


def kv_heads_in_config(model: nn.Module) -> bool:
    """Whether the config's ``num_key_value_heads`` sets the key/value heads (converted models export natively)."""
    return family_layout(getattr(model.config, "model_type", None)).head_dim_in_config


def convertible_sites(model: nn.Module, verb: str) -> list[AttentionSite]:
    """The decoder self-attention sites ``verb`` converts; raises for models it cannot convert."""
    config = getattr(model, "config", None)
    family = getattr(config, "model_type", None)
    sites = find_sites(model)
    if not any(s.kind == "dec-self" for s in sites):
        raise HeadwiseError(f"{verb} shrinks the key/value cache of decoder self-attention, and "
                            f"{type(model).__name__} has none (kinds: {', '.join(sorted({s.kind for s in sites}))}): "
                            "an encoder keeps no KV cache; use a decoder or an encoder-decoder")
    if not family_layout(family).kv_conversion:
        raise HeadwiseError(f"{verb} supports {', '.join(families_with('kv_conversion'))} (separate q/k/v "
                            f"projections); {family} is not one of them")
    if family_layout(family).head_dim_in_config:
        rope = dict(getattr(config, "rope_parameters", None) or {})
        partial = rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
        if partial not in (None, 1, 1.0):
            raise HeadwiseError(f"{verb}: partial rotary embeddings (partial_rotary_factor={partial}) are not supported")
    sites = [s for s in sites if s.kind == "dec-self"]
    refuse_offloaded(sites, verb)
    for site in sites:
        if ops_of(site) is not None:
            raise HeadwiseError(f"{site.name} carries headwise ops (gates, observers, mechanisms); detach or fold them "
                                f"(headwise.pruning.prune_masked) before {verb}")
        kinds = {type(p.module).__name__ for p in (site.q, site.k, site.v, site.o)}
        if kinds != {"Linear"}:
            raise HeadwiseError(f"{site.name} has {sorted(kinds)} projections (already converted to latent or "
                                f"collaborative heads?); {verb} needs plain nn.Linear q/k/v/o")
        biases = {getattr(p.module, "bias", None) is not None for p in (site.q, site.k, site.v)}
        if len(biases) > 1:
            raise HeadwiseError(f"{site.name}: q/k/v projections disagree on biases; {verb} needs all or none")
    return sites


def check_calibration(init: str, calibration: object, grouping: str = "contiguous") -> None:
    """``init="calibrated"`` needs data; other inits ignore it (refused) unless similarity grouping reads it."""
    if init == "calibrated" and calibration is None:
        raise HeadwiseError("init='calibrated' needs calibration batches (input-id tensors or model-input dicts); "
                            "pass calibration=..., or use init='svd' (weight space, no data)")
    if init != "calibrated" and calibration is not None and grouping != "similarity":
        raise HeadwiseError(f"init={init!r} ignores the calibration set; use init='calibrated' to fit on it")
