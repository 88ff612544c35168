"""Plain transformers export: a model whose heads were removed (pruning) or whose key/value heads were merged
(``convert_gqa``) is, for families whose config carries ``head_dim`` and ``num_key_value_heads`` (Llama, Mistral,
Qwen2), a standard architecture with other head counts; it is saved so that ``AutoModel.from_pretrained`` loads it
without headwise. Everything else is saved with ``headwise.save_pretrained``."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

from torch import nn

from ..errors import HeadwiseError
from ..runtime.ops import ops_of
from ..sites import families_with, family_layout, find_sites
from .checkpoint import save_native


def _plain_class(module: nn.Module) -> bool:
    return type(module).__module__.split(".")[0] in ("transformers", "torch")


def plain_problem(model: nn.Module) -> str | None:
    """Why ``model`` cannot be saved as a plain transformers checkpoint, or None if it can."""
    family = model.config.model_type
    if not family_layout(family).head_dim_in_config:
        return (f"{family} configs have no key/value head count (num_key_value_heads) and head_dim: plain export "
                f"supports {', '.join(families_with('head_dim_in_config'))}; save with headwise.save_pretrained")
    sites = find_sites(model)
    foreign = [s.name for s in sites if not all(_plain_class(m) for m in (s.module, s.q.module, s.k.module,
                                                                          s.v.module, s.o.module))]
    if foreign:
        return (f"latent keys/values or collaborative heads (headwise modules in {', '.join(foreign[:3])}) have no "
                "transformers class; save with headwise.save_pretrained")
    shapes = {(s.num_heads, s.num_kv_heads, s.head_dim) for s in sites}
    if len(shapes) != 1:
        return (f"plain export needs the same head counts in every layer, got {sorted(shapes)} (query, key/value, "
                "head_dim); prune uniformly (e.g. the same number of key/value groups per layer) or use "
                "headwise.save_pretrained")
    attached = [s.name for s in sites if ops_of(s) is not None]
    if attached:
        return (f"sites {attached[:3]} still carry headwise ops; fold gates with headwise.pruning.prune_masked(model) "
                "or detach them before a plain export")
    return None


def export_plain(model: nn.Module, path: str | os.PathLike, tokenizer: Any = None, overwrite: bool = False) -> Path:
    """Save ``model`` with transformers' own ``save_pretrained`` under a config stating its head counts
    (``num_attention_heads``, ``num_key_value_heads``, ``head_dim``), and ``tokenizer`` beside it; refuses what a
    plain checkpoint cannot represent (:func:`plain_problem`) before writing anything."""
    problem = plain_problem(model)
    if problem:
        raise HeadwiseError(f"cannot export {type(model).__name__} as plain transformers: {problem}")
    site = find_sites(model)[0]
    config = copy.deepcopy(model.config)
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = (site.num_heads, site.num_kv_heads,
                                                                                site.head_dim)
    return save_native(model, path, config=config, tokenizer=tokenizer, overwrite=overwrite)
