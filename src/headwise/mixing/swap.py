"""Head swapping (MHR "rotation"): exchange the q/k/v weight slices and biases of two heads, in place.

The output projection is not swapped (as in MHR): the moved head is projected by its new site's ``W^O``
columns. ``include_output=True`` also exchanges those columns, which moves the whole head. Sites are addressed
by exact name (``enc-self.3``) or module path, never by substring (B.7.6); attached ops (gates, mixers) and
optimizer moments stay where they are. Swapping disjoint pairs is an involution: applying the same list again
in reverse order restores the model bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
from torch import nn

from ..errors import HeadwiseError
from ..sites import AttentionSite, find_sites, site_table


@dataclass(frozen=True)
class HeadSwap:
    """Exchange head ``a_head`` of site ``a`` with head ``b_head`` of site ``b`` (names or paths, 0-based)."""

    a: str
    a_head: int
    b: str
    b_head: int

    @classmethod
    def parse(cls, text: str) -> "HeadSwap":
        """``"enc-self.1:3 <-> enc-self.4:0"`` (also ``<>``, ``,`` or whitespace between the two heads)."""
        parts = text.replace("<->", " ").replace("<>", " ").replace(",", " ").split()
        try:
            (a, ah), (b, bh) = (p.rsplit(":", 1) for p in parts)
            return cls(a, int(ah), b, int(bh))
        except ValueError:
            raise HeadwiseError(f"cannot read swap {text!r}; write it as 'enc-self.1:3 <-> enc-self.4:0'") from None

    def __str__(self) -> str:
        return f"{self.a}:{self.a_head} <-> {self.b}:{self.b_head}"


def resolve(model: nn.Module, swaps: Iterable[HeadSwap | str]) -> list[tuple[AttentionSite, int, AttentionSite, int]]:
    """Check every swap against ``model``; returns ``(site_a, head_a, site_b, head_b)`` tuples. Nothing changes."""
    sites = find_sites(model)
    table, names = site_table(sites), ", ".join(s.name for s in sites)
    plan = []
    for swap in swaps:
        swap = HeadSwap.parse(swap) if isinstance(swap, str) else swap
        ends = []
        for name, head in ((swap.a, swap.a_head), (swap.b, swap.b_head)):
            site = table.get(name)
            if site is None:
                raise HeadwiseError(f"swap {swap}: no attention site {name!r}; sites: {names}")
            if not 0 <= head < site.num_heads:
                raise HeadwiseError(f"swap {swap}: {site.name} has heads 0..{site.num_heads - 1}, not {head}")
            if site.group_size != 1:
                raise HeadwiseError(f"swap {swap}: {site.name} uses grouped-query attention ({site.group_size} query "
                                    "heads per key/value head); swapping needs one key/value head per query head")
            ends.append((site, head))
        (sa, ha), (sb, hb) = ends
        if sa.head_dim != sb.head_dim or sa.hidden_size != sb.hidden_size:
            raise HeadwiseError(f"swap {swap}: head shapes differ ({sa.name}: head_dim {sa.head_dim}, hidden "
                                f"{sa.hidden_size}; {sb.name}: head_dim {sb.head_dim}, hidden {sb.hidden_size})")
        if sa.kind != sb.kind:
            raise HeadwiseError(f"swap {swap}: {sa.name} and {sb.name} are different attention kinds; MHR swaps "
                                "only within one kind")
        if sa is sb and ha == hb:
            raise HeadwiseError(f"swap {swap}: swaps a head with itself")
        plan.append((sa, ha, sb, hb))
    return plan


def _exchange(x: torch.Tensor, i: int, y: torch.Tensor, j: int) -> None:
    """Swap ``x[i]`` and ``y[j]`` in place (views into parameters)."""
    tmp = x[i].clone()
    x[i].copy_(y[j])
    y[j].copy_(tmp)


@torch.no_grad()
def swap_heads(model: nn.Module, swaps: Sequence[HeadSwap | str], include_output: bool = False) -> nn.Module:
    """Apply ``swaps`` in order (``HeadSwap`` or ``"site:head <-> site:head"``), in place; returns the model.

    Exchanges ``q/k/v`` weight rows ``[head_dim, in]`` and bias entries ``[head_dim]``; with ``include_output`` also
    ``W^O`` columns. Every swap is validated before any weight moves.
    """
    plan = resolve(model, swaps)
    for sa, ha, sb, hb in plan:
        projections = ["q", "k", "v"] + (["o"] if include_output else [])
        for name in projections:
            pa, pb = getattr(sa, name), getattr(sb, name)
            _exchange(pa.weight, ha, pb.weight, hb)
            if name != "o" and pa.bias is not None:
                _exchange(pa.bias, ha, pb.bias, hb)
    return model


def undo_swaps(model: nn.Module, swaps: Sequence[HeadSwap | str], include_output: bool = False) -> nn.Module:
    """Undo ``swap_heads(model, swaps)``: the same swaps in reverse order."""
    return swap_heads(model, list(swaps)[::-1], include_output)
