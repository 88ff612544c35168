"""``row_gates``: per-layer, per-sample head gates (``runtime.RowGate``) behind gradient and ablation importance.

``headwise.runtime.HeadGate`` holds one weight per head and module. Importance needs two more things: one gate
per *layer* for a module that serves several (ALBERT), and one gate per *sample* so that a single expanded
batch can zero a different head in every copy (ablation sweep) or give per-example gradients. ``RowGate``
does both; it is attached in the ``output`` slot, so it runs on every attention path (SDPA included).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn

from ..sites import AttentionSite
from ..runtime.gates import RowGate
from .attach import per_site
from .rows import Row


class Gates:
    """The ``RowGate`` of every site of ``rows``; ``set(weight[rows, N|1, H])`` dispatches a row table to them."""

    def __init__(self, rows: list[Row], gates: dict[str, RowGate]) -> None:
        self.rows, self.gates = rows, gates
        self.heads = max(r.site.num_heads for r in rows)

    def ones(self, samples: int = 1, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.ones(len(self.rows), samples, self.heads, device=device)

    def set(self, weight: torch.Tensor) -> None:
        for row in self.rows:
            if row.layer == row.site.layers[0]:
                n = len(row.site.layers)
                self.gates[row.site.path].weight = weight[row.index : row.index + n, :, : row.site.num_heads]


@contextmanager
def row_gates(model: nn.Module, rows: list[Row]) -> Iterator[Gates]:
    """Attach identity ``RowGate``s to every site of ``rows`` for the block; detached on exit."""

    def build(site: AttentionSite, first_row: int, n_layers: int) -> RowGate:
        return RowGate(n_layers, site.num_heads)

    with per_site(model, rows, build, slot="output", prefix="analysis_gate") as gates:
        yield Gates(rows, gates)
