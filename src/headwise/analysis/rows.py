"""Rows of the statistics tables: one per (self-attention site, layer it serves).

A shared module (ALBERT) serves several layers and so gives several rows; within one forward pass it is called
once per layer, in layer order, which is how observers and gates know which row a call belongs to.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..errors import HeadwiseError
from ..sites import AttentionSite, find_sites


@dataclass(frozen=True)
class Row:
    index: int  # row number in every table
    site: AttentionSite
    layer: int  # the layer this row describes (one of site.layers)

    def describe(self) -> dict:
        """``site.describe()`` narrowed to this layer (name ``kind.layer``)."""
        info = self.site.describe()
        if self.site.shared:
            info.update(name=f"{self.site.kind}.{self.layer}", layers=[self.layer])
        return info


def rows_of(model: nn.Module, cross_attention: bool = False) -> list[Row]:
    """Every self-attention row of ``model``, in site order then layer order; with ``cross_attention`` the
    ``dec-enc`` rows too (encoder-decoders analysed with source and target inputs, ``analyze_seq2seq``).

    Cross-attention sites are left out by default: ``analyze`` runs base models on one text input.
    """
    rows: list[Row] = []
    for site in find_sites(model):
        if site.kind == "dec-enc" and not cross_attention:
            continue
        for layer in site.layers:
            rows.append(Row(len(rows), site, layer))
    if not rows:
        raise HeadwiseError(f"{type(model).__name__} has no self-attention sites to analyse")
    return rows


def rows_by_site(rows: list[Row]) -> list[tuple[AttentionSite, int, int]]:
    """``(site, first row, number of layers)`` for each distinct site."""
    out: list[tuple[AttentionSite, int, int]] = []
    for row in rows:
        if out and out[-1][0] is row.site:
            out[-1] = (row.site, out[-1][1], out[-1][2] + 1)
        else:
            out.append((row.site, row.index, 1))
    return out
