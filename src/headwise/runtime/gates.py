"""Per-head output gates: ``out[:, :, h] *= g_h``. The building block of masks, importance and L0 pruning."""

from __future__ import annotations

import torch
from torch import nn

from ..sites import AttentionSite, find_sites
from .ops import HeadOp, attach, attached


class HeadGate(HeadOp):
    """A learnable scale per head, initialised to ones (attaching it changes nothing).

    ``forward(out[B, Tq, H, d]) -> [B, Tq, H, d]``.
    """

    op_type = "gate"

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(num_heads))

    def spec(self) -> dict:
        return {"num_heads": self.weight.numel()}

    def select_heads(self, keep: torch.Tensor) -> None:
        """Follow a head removal: keep only the entries of ``keep``."""
        self.weight = nn.Parameter(self.weight.detach()[keep.to(self.weight.device)].clone())

    def forward(self, out: torch.Tensor) -> torch.Tensor:
        return out * self.weight.to(out.dtype)[:, None]


def add_gates(model: nn.Module, sites: list[AttentionSite] | None = None, name: str = "gate") -> dict[str, HeadGate]:
    """Attach a ``HeadGate`` to each site (all sites by default); returns ``{site.path: gate}``.

    Remember ``headwise.enable(model)`` (or load through headwise) so the ``headwise`` implementation runs them.
    """
    return {s.path: attach(s, "output", name, HeadGate(s.num_heads)) for s in sites or find_sites(model)}


def gates_of(model: nn.Module, name: str = "gate") -> dict[str, HeadGate]:
    """The gates called ``name`` currently attached, keyed by site path."""
    return attached(model, "output", name)
