"""Plain transformers export: a folder ``AutoModel*.from_pretrained`` loads without headwise, computing what the
edited model computes.

Two ways, chosen by what the family's config can say:

- **native head counts**: a model whose heads were removed (pruning) or whose key/value heads were merged
  (``convert_gqa``) is, for families whose config carries ``head_dim`` and ``num_key_value_heads`` (Llama,
  Mistral, Qwen2) and the same counts in every layer, a standard architecture with fewer heads: saved as that.
- **zero-padded heads**: everywhere else (BERT-family, GPT-2, ViT, BART/Marian/T5, Llama with other counts per
  layer) the model is written at its config's head counts, each removed head (or key/value group) present with zero
  query/key/value rows and zero output-projection columns. A head's output reaches the model only through its
  output columns, so a zero head adds exactly nothing: the folder computes the pruned model's outputs (the file is
  as large as the unpruned model's; only headwise's folder is smaller and faster). A T5 head keeps its original
  index, whose column of the shared position bias it reads.

What plain transformers cannot hold is refused before anything is written (``plain_problem``): headwise modules
(latent keys/values, collaborative heads), attached ops (gates, quantizers, mechanisms) and a cache that
``generate()`` builds the headwise way (a KV policy).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers.initialization import no_init_weights

from ..errors import HeadwiseError
from ..runtime.attention import BIAS_HEADS
from ..runtime.ops import ops_of
from ..sites import AttentionSite, family_layout, find_sites
from .checkpoint import save_native

GENERATION_HOOK = "_prepare_cache_for_generation"  # wrapped on the instance by methods that build their own cache


def _plain_class(module: nn.Module) -> bool:
    return type(module).__module__.split(".")[0] in ("transformers", "torch")


def _native(sites: list[AttentionSite], family: str) -> bool:
    """Whether the head counts can be written into the config itself (one shape in every layer, a config with
    ``head_dim`` and ``num_key_value_heads``)."""
    return family_layout(family).head_dim_in_config and len(
        {(s.num_heads, s.num_kv_heads, s.head_dim) for s in sites}) == 1


def _unpruned(model: nn.Module) -> nn.Module:
    """The model the config builds (on the meta device: shapes only)."""
    with torch.device("meta"):
        return type(model)._from_config(copy.deepcopy(model.config))


def _padding_problem(model: nn.Module, sites: list[AttentionSite]) -> str | None:
    """Why the removed heads cannot be padded back to the config's head counts, or None."""
    targets = {s.path: s for s in find_sites(_unpruned(model))}
    for site in sites:
        target = targets.get(site.path)
        if target is None:
            return f"the config builds no attention module {site.path}; save with headwise.save_pretrained"
        if site.group_size != target.group_size:
            return (f"{site.name} shares key/value heads ({site.group_size} query heads each), which a "
                    f"{model.config.model_type} config cannot state (it has no key/value head count); save with "
                    "headwise.save_pretrained")
        if site.head_dim != target.head_dim or site.num_heads > target.num_heads \
                or site.num_kv_heads > target.num_kv_heads:
            return (f"{site.name} has {site.num_heads} query / {site.num_kv_heads} key-value heads of size "
                    f"{site.head_dim}, which zero heads cannot pad to the config's {target.num_heads} / "
                    f"{target.num_kv_heads} of size {target.head_dim}; save with headwise.save_pretrained")
    return None


def plain_problem(model: nn.Module) -> str | None:
    """Why ``model`` cannot be saved as a plain transformers checkpoint that computes what it computes, or None if
    it can (natively or with zero-padded heads: see the module docstring)."""
    sites = find_sites(model)
    foreign = [s.name for s in sites if not all(_plain_class(m) for m in (s.module, s.q.module, s.k.module,
                                                                          s.v.module, s.o.module))]
    if foreign:
        return (f"latent keys/values or collaborative heads (headwise modules in {', '.join(foreign[:3])}) have no "
                "transformers class; save with headwise.save_pretrained")
    attached = [s.name for s in sites if ops_of(s) is not None]
    if attached:
        return (f"sites {attached[:3]} still carry headwise ops; fold gates with headwise.pruning.prune_masked(model) "
                "or detach them before a plain export")
    if GENERATION_HOOK in model.__dict__:
        return ("its generate() builds a headwise cache (a KV policy), which plain transformers would replace by the "
                "full cache; load it with headwise.from_pretrained (its weights are the base model's: the base model "
                "itself is the plain copy)")
    if _native(sites, model.config.model_type):
        return None
    return _padding_problem(model, sites)


def export_plain(model: nn.Module, path: str | os.PathLike, tokenizer: Any = None, overwrite: bool = False) -> Path:
    """Save ``model`` with transformers' own ``save_pretrained`` so that plain transformers loads it and computes
    what it computes: under a config stating its head counts (``num_attention_heads``, ``num_key_value_heads``,
    ``head_dim``) where the family allows, else at the config's head counts with removed heads zero-padded; and
    ``tokenizer`` beside it. Refuses what a plain checkpoint cannot represent (:func:`plain_problem`) before writing
    anything."""
    problem = plain_problem(model)
    if problem:
        raise HeadwiseError(f"cannot export {type(model).__name__} as plain transformers: {problem}")
    sites = find_sites(model)
    if _native(sites, model.config.model_type):
        config = copy.deepcopy(model.config)
        config.num_attention_heads, config.num_key_value_heads, config.head_dim = (
            sites[0].num_heads, sites[0].num_kv_heads, sites[0].head_dim)
        return save_native(model, path, config=config, tokenizer=tokenizer, overwrite=overwrite)
    return save_native(padded(model), path, tokenizer=tokenizer, overwrite=overwrite)


@torch.no_grad()
def padded(model: nn.Module) -> nn.Module:
    """A copy of ``model`` at its config's head counts (a transformers model of the same class): every weight
    copied, each removed head's query/key/value rows and output columns zero (see the module docstring)."""
    config = copy.deepcopy(model.config)
    if hasattr(config, "headwise"):
        del config.headwise
    with no_init_weights():
        plain = type(model)._from_config(config, dtype=next(model.parameters()).dtype)
    plain.to(next(model.parameters()).device)
    source, wanted = model.state_dict(), plain.state_dict()
    shaped = {k: v for k, v in source.items() if k in wanted and wanted[k].shape == v.shape}
    plain.load_state_dict(shaped, strict=False)
    targets = {s.path: s for s in find_sites(plain)}
    names = {id(p): k for k, p in plain.named_parameters(remove_duplicate=False)}
    heads = {names[id(p)] for t in targets.values() for proj in (t.q, t.k, t.v, t.o)
             for p in (proj.module.weight, proj.module.bias) if p is not None}
    left = sorted(set(wanted) - set(shaped) - heads)
    if left:
        raise HeadwiseError(f"cannot export {type(model).__name__} as plain transformers: {left[:3]} differ from "
                            "what its config builds outside the attention heads; save with headwise.save_pretrained")
    for site in find_sites(model):
        target = targets[site.path]
        slots = list(getattr(site.module, BIAS_HEADS, range(site.num_heads)))  # T5: each head's bias column
        kv_slots = slots if site.num_kv_heads == site.num_heads else list(range(site.num_kv_heads))
        for name, where in (("q", slots), ("k", kv_slots), ("v", kv_slots), ("o", slots)):
            have, want = getattr(site, name), getattr(target, name)
            want.weight.zero_()
            if want.bias is not None and want.axis == "out":
                want.bias.zero_()
            for head, slot in enumerate(where):
                want.weight[slot] = have.weight[head]
                if want.bias is not None and want.axis == "out":
                    want.bias[slot] = have.bias[head]
    return plain.eval()
