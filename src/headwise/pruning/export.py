"""Export a uniformly pruned Llama-family model as a plain transformers checkpoint (no headwise needed).

Llama, Mistral and Qwen2 configs carry ``head_dim`` explicitly, so fewer heads of the same size is a standard
architecture: ``num_attention_heads`` and ``num_key_value_heads`` shrink, ``hidden_size`` stays.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

from torch import nn

from ..errors import HeadwiseError
from ..io import check_writable_dir, save_native
from ..runtime.ops import ops_of
from ..sites import families_with, family_layout, find_sites


def plain_problem(model: nn.Module) -> str | None:
    """Why ``model`` cannot be exported in plain transformers format, or None if it can."""
    if not family_layout(model.config.model_type).head_dim_in_config:
        return (f"plain export supports {', '.join(families_with('head_dim_in_config'))} (configs with head_dim); "
                f"{model.config.model_type} models are saved with headwise.save_pretrained instead")
    sites = find_sites(model)
    shapes = {(s.num_heads, s.num_kv_heads) for s in sites}
    if len(shapes) != 1:
        return (f"plain export needs the same head counts in every layer, got {sorted(shapes)} (query, key/value); "
                "prune uniformly (e.g. the same number of key/value groups per layer) or use headwise.save_pretrained")
    attached = [s.name for s in sites if ops_of(s) is not None]
    if attached:
        return (f"sites {attached} still carry headwise ops; fold gates with headwise.pruning.prune_masked(model) "
                "or detach them before a plain export")
    return None


def export_plain(model: nn.Module, path: str | os.PathLike, tokenizer: Any = None, overwrite: bool = False) -> Path:
    """Save ``model`` with ``transformers``' own ``save_pretrained`` and a config that states the pruned head
    counts; ``AutoModel.from_pretrained(path)`` then loads it without headwise. Requires every layer to keep
    the same number of query and key/value heads and no attached headwise ops (``prune_masked`` folds gates).
    ``tokenizer``, when given, is saved in the same folder."""
    config = model.config
    problem = plain_problem(model)
    if problem:
        raise HeadwiseError(problem)
    check_writable_dir(path, overwrite)
    sites = find_sites(model)
    heads, kv_heads = sites[0].num_heads, sites[0].num_kv_heads
    plain = copy.deepcopy(config)
    plain.num_attention_heads, plain.num_key_value_heads = heads, kv_heads
    plain.head_dim = sites[0].head_dim
    return save_native(model, path, config=plain, tokenizer=tokenizer, overwrite=overwrite)
