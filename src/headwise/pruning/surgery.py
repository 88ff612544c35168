"""Physical head removal: slice q/k/v rows and o columns so the model gets smaller and faster.

transformers 5 removed ``prune_heads``; this is its replacement for every supported family, recorded in
``config.headwise`` so ``headwise.from_pretrained`` rebuilds the pruned shapes before loading weights.

T5 computes its relative position bias ``[1, H, Tq, Tk]`` in layer 0 of a stack (``relative_attention_bias``,
``[buckets, H]``) and hands that one tensor to every layer, so the bias table cannot be sliced for one layer.
A pruned T5 module instead keeps ``n_heads`` (the width of that shared tensor and of its zero bias) and lists
in ``BIAS_HEADS`` the original head index of each remaining head; the ``headwise`` attention reads those columns.
Pruned T5 models therefore run under the ``headwise`` implementation (which ``headwise.from_pretrained`` selects).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from ..errors import HeadwiseError
from ..contract import record
from ..runtime.attention import BIAS_HEADS
from ..runtime.dispatch import refuse_offloaded
from ..runtime.ops import SLOTS, ops_of
from ..sites import AttentionSite, HeadProjection, find_sites, recorded_sites, site_table

EDIT_KIND = "prune_heads"  # its format-1 edit kind


def _feature_index(proj: HeadProjection, heads: Sequence[int]) -> torch.Tensor:
    """Indices of the features (rows for q/k/v, columns for o) that belong to ``heads``."""
    span = torch.arange(proj.head_dim)
    return torch.cat([proj.offset + h * proj.head_dim + span for h in heads]).long()


def _sliced(module: nn.Module, axis: str, index: torch.Tensor) -> nn.Module:
    """A copy of a Linear/Conv1D keeping only ``index`` of its output (``axis="out"``) or input features."""
    w, b = module.weight.detach(), None if module.bias is None else module.bias.detach()
    index = index.to(w.device)
    if isinstance(module, Conv1D):  # weight [in, out]
        w = w[:, index] if axis == "out" else w[index]
        new = Conv1D(w.shape[1], w.shape[0])
    elif isinstance(module, nn.Linear):
        w = w[index] if axis == "out" else w[:, index]
        new = nn.Linear(w.shape[1], w.shape[0], bias=b is not None)
    else:
        raise HeadwiseError(f"cannot slice a {type(module).__name__}; surgery supports nn.Linear and Conv1D")
    if b is not None and axis == "out":
        b = b[index]
    new = new.to(device=w.device, dtype=w.dtype)
    with torch.no_grad():
        new.weight.copy_(w)
        if b is not None:
            new.bias.copy_(b)
    new.train(module.training)
    return new


def _replace(model: nn.Module, old: nn.Module, new: nn.Module) -> None:
    for parent in model.modules():
        for name, child in parent.named_children():
            if child is old:
                setattr(parent, name, new)


def validate_removal(site: AttentionSite, heads: Sequence[int], allow_empty: bool = False,
                     folding: Sequence[str] = ()) -> tuple[list[int], list[int]]:
    """Check a removal request; return (query heads kept, kv heads kept). Removing every head keeps the first
    key/value group physically (its output columns are zeroed by the caller). ``folding``: names of ops that are
    folded and detached before the removal (they need not follow it)."""
    if site.shares_query_key:
        raise HeadwiseError(f"{site.name} holds collaborative heads (shared query/key); prune before compressing")
    bad = [h for h in heads if not 0 <= int(h) < site.num_heads]
    if bad:
        raise HeadwiseError(f"{site.name}: head index {bad[0]} out of range; it has heads 0..{site.num_heads - 1}")
    if len(set(heads)) != len(heads):
        raise HeadwiseError(f"{site.name}: head list {list(heads)} repeats a head")
    removed = set(map(int, heads))
    g = site.group_size
    if len(removed) == site.num_heads:
        if not allow_empty:
            raise HeadwiseError(
                f"{site.name}: removing all {site.num_heads} heads removes the whole attention sublayer (its output "
                "becomes the output-projection bias, added to the residual stream); pass allow_empty_layers=True "
                "(CLI: --allow-empty-layers) if that is what you want"
            )
        removed -= set(range(g))
    kv_removed = {h // g for h in removed}
    partial = sorted(kv for kv in kv_removed if not all(kv * g + i in removed for i in range(g)))
    if partial:
        group = list(range(partial[0] * g, partial[0] * g + g))
        raise HeadwiseError(
            f"{site.name} uses grouped-query attention ({g} query heads share each key/value head): remove whole "
            f"groups, e.g. all of {group}, or none of them"
        )
    ops = ops_of(site)
    for slot in SLOTS if ops is not None else ():
        for name, op in getattr(ops, slot).items():
            if name not in folding and not hasattr(op, "select_heads"):
                raise HeadwiseError(f"{site.name}: op {name!r} ({type(op).__name__}) cannot follow a head removal; "
                                    "detach it first")
    keep = [h for h in range(site.num_heads) if h not in removed]
    return keep, [kv for kv in range(site.num_kv_heads) if kv not in kv_removed]


def _prune_site(model: nn.Module, site: AttentionSite, keep: list[int], keep_kv: list[int]) -> None:
    per_module: dict[int, tuple[nn.Module, str, list[torch.Tensor]]] = {}
    for proj, heads in ((site.q, keep), (site.k, keep_kv), (site.v, keep_kv), (site.o, keep)):
        entry = per_module.setdefault(id(proj.module), (proj.module, proj.axis, []))
        entry[2].append(_feature_index(proj, heads))
    for module, axis, parts in per_module.values():
        _replace(model, module, _sliced(module, axis, torch.cat(parts)))
    attn, layout = site.module, site.layout
    if layout.position_bias:  # T5: the stack's shared position bias keeps its original heads
        read = getattr(attn, BIAS_HEADS, tuple(range(site.num_heads)))
        setattr(attn, BIAS_HEADS, tuple(read[h] for h in keep))
    else:
        for attr in layout.head_counts:
            if isinstance(getattr(attn, attr, None), int):
                setattr(attn, attr, len(keep))
    for attr in layout.head_sizes:  # e.g. GPT-2 splits the fused c_attn output by split_size
        if isinstance(getattr(attn, attr, None), int):
            setattr(attn, attr, len(keep) * site.head_dim)
    ops = ops_of(site)
    if ops is not None:
        index = torch.tensor(keep)
        for slot in SLOTS:
            for op in getattr(ops, slot).values():
                op.select_heads(index)


def _resolve(model: nn.Module, heads: Mapping[str | AttentionSite, Sequence[int]]) -> dict[str, list[int]]:
    sites = find_sites(model)
    table = site_table(sites)
    plan = {}
    for key, hs in heads.items():
        site = table.get(key.path if isinstance(key, AttentionSite) else key)
        if site is None:
            raise HeadwiseError(f"no attention site {key!r}; sites: {', '.join(s.name for s in sites)}")
        plan[site.path] = sorted(int(h) for h in hs)
    return plan


def prune_heads(model: nn.Module, heads: Mapping[str | AttentionSite, Sequence[int]],
                allow_empty_layers: bool = False) -> nn.Module:
    """Physically remove heads: ``{site (object, path or name like "enc-self.3"): [head indices]}``.

    Indices refer to the site's current heads. Attached gates are sliced along. Validates everything before
    changing anything, so a bad request leaves the model untouched. Returns the model.

    Removing every head of a site is refused unless ``allow_empty_layers``: then the attention sublayer only
    adds its output-projection bias to the residual stream. Transformers modules cannot run with zero heads, so
    the first head (key/value group) stays in the weights with its output-projection columns zeroed.
    """
    plan = _resolve(model, heads)
    sites = {s.path: s for s in find_sites(model)}
    refuse_offloaded([sites[path] for path, hs in plan.items() if hs], "prune_heads")
    kept = {path: validate_removal(sites[path], hs, allow_empty_layers) for path, hs in plan.items() if hs}
    for path, (keep, keep_kv) in kept.items():
        _prune_site(model, sites[path], keep, keep_kv)
    emptied = [path for path in kept if len(plan[path]) == sites[path].num_heads]
    for site in find_sites(model):
        if site.path in emptied:
            with torch.no_grad():
                site.o.weight.zero_()
    if kept:
        state = {"heads": {p: plan[p] for p in kept}}
        if emptied:
            state["allow_empty_layers"] = True
        record(model, "prune_heads", {"heads": {sites[p].name: plan[p] for p in kept},
                                       "allow_empty_layers": allow_empty_layers}, state)
    return model


def replay_prune_heads(model: nn.Module, entry: dict) -> None:
    """Remove the heads a journal entry lists (``state["heads"]``: ``{site path: [head indices]}``)."""
    state = entry["state"]
    sites = recorded_sites(model, state["heads"], f"edit {EDIT_KIND}")
    for path, hs in state["heads"].items():
        keep, keep_kv = validate_removal(sites[path], hs, state.get("allow_empty_layers", False))
        _prune_site(model, sites[path], keep, keep_kv)
