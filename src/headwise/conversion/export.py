"""Save a grouped-query conversion as a plain transformers checkpoint (no headwise needed to load it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch import nn

from ..errors import HeadwiseError
from ..io import save_native
from ..runtime.ops import ops_of
from ..sites import find_sites
from .checks import kv_heads_in_config
from .layer import is_latent


def native_reason(model: nn.Module) -> str | None:
    """Why ``model`` cannot be exported natively (None when it can)."""
    family = model.config.model_type
    if any(is_latent(s.module) for s in find_sites(model)):
        return ("latent keys/values have no transformers class that keeps the rotary embedding on every key "
                "dimension (DeepSeek-V3's MLA normalises the latent and rotates only a shared rope head)")
    if not kv_heads_in_config(model):
        return f"{family} configs have no key/value head count (num_key_value_heads)"
    if any(ops_of(s) is not None for s in find_sites(model)):
        return "headwise ops are attached (gates, observers, mechanisms)"
    return None


def export_native(model: nn.Module, path: str | os.PathLike, tokenizer: Any = None, overwrite: bool = False) -> Path:
    """Write ``model`` with transformers' own ``save_pretrained`` (config with ``num_key_value_heads``), so that
    ``AutoModelForCausalLM.from_pretrained(path)`` loads it; refuses what that cannot represent (see
    :func:`native_reason`) — save those with ``headwise.save_pretrained``."""
    reason = native_reason(model)
    if reason is not None:
        raise HeadwiseError(f"cannot export {type(model).__name__} natively: {reason}; use headwise.save_pretrained "
                            "and headwise.from_pretrained")
    return save_native(model, path, tokenizer=tokenizer, overwrite=overwrite)
