"""From gates to a smaller model: remove every head whose gate is 0 and fold the other gate values into the
output projection, so the result is a plain (smaller) model that computes exactly what the gated one did."""

from __future__ import annotations

import torch
from torch import nn

from ..errors import HeadwiseError
from ..runtime.dispatch import refuse_offloaded
from ..runtime.gates import Gate
from ..runtime.ops import detach, ops_of
from ..sites import AttentionSite, find_sites
from .surgery import prune_heads, validate_removal


def _foldable(op: nn.Module) -> bool:
    return isinstance(op, Gate) and op.inference() is not None


@torch.no_grad()
def head_factors(site: AttentionSite) -> tuple[torch.Tensor, list[str]]:
    """The product of the inference values of the site's foldable gates ``[H]``, and the gates' names."""
    ops = ops_of(site)
    factor, names = torch.ones(site.num_heads), []
    if ops is None:
        return factor, names
    for name, op in ops.output.items():
        if _foldable(op):
            factor = factor * op.inference().detach().float().cpu()
            names.append(name)
    others = [n for n, op in ops.output.items() if not _foldable(op)]
    if names and others:
        raise HeadwiseError(f"{site.name} has output ops {others} besides its gates; gates can only be folded "
                            "when they are the only output ops (fold or detach the others first)")
    return factor, names


@torch.no_grad()
def prune_masked(model: nn.Module, allow_empty_layers: bool = False) -> dict[str, list[int]]:
    """Remove the heads whose gates' inference values (the ``Gate`` protocol: masks, scales, L0 gates at eval)
    are 0, fold the remaining values into the output projection and detach the gates. Returns ``{site name: removed}``.

    Validates every site before changing anything. Outputs equal the gated model in eval mode.
    """
    sites = find_sites(model)
    plan, factors = {}, {}
    for site in sites:
        factor, names = head_factors(site)
        if not names:
            continue
        factors[site.path] = (factor, names)
        removed = [h for h in range(site.num_heads) if factor[h] == 0]
        if removed:
            plan[site.path] = removed
    by_path = {s.path: s for s in sites}
    refuse_offloaded([by_path[path] for path in factors], "prune_masked")  # folding rewrites W_o
    for path, removed in plan.items():  # every site is checked before the first change
        validate_removal(by_path[path], removed, allow_empty_layers, folding=factors[path][1])
    for site in sites:
        if site.path in factors:
            ops = ops_of(site)
            for name in factors[site.path][1]:
                ops.output[name].fold(site.o.weight)
                detach(site, name)
    prune_heads(model, plan, allow_empty_layers)
    return {by_path[p].name: hs for p, hs in plan.items()}
