"""One gate algebra: every per-head factor on the attention output is a ``Gate``.

A gate multiplies head ``h`` of the attention output ``out[B, Tq, H, d]`` (the ``output`` slot, so it runs on every
attention path) by a factor. The protocol has three parts:

- ``values()``: the factor this forward uses, ``[H]`` or ``[B, 1, H]`` (a training draw for stochastic gates);
- ``inference()``: the factor ``[H]`` at inference, or ``None`` when it cannot be folded (per-sample gates);
- ``fold(weight[H, ...])``: multiply a per-head weight (the output projection's head columns) by ``inference()``,
  so the gate can be removed and the model computes the same; heads whose factor is 0 can then be cut.

Variants: ``HeadMask`` (fixed 0/1), ``HeadGate`` (learnable scale), ``HardConcreteGate`` (L0, stochastic; in
``hard_concrete.py``) and ``RowGate`` (per layer and sample, transient: importance and ablation).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from ..sites import AttentionSite, Selection, selection_of
from .attention import enable
from .ops import HeadOp, attach, attached, detach_all


class Gate(nn.Module):
    """Base of every gate: ``forward(out[B, Tq, H, d]) = out * values()`` per head."""

    def values(self) -> torch.Tensor:
        """The factor of this forward: ``[H]`` or ``[B, 1, H]``."""
        raise NotImplementedError

    def inference(self) -> torch.Tensor | None:
        """The factor ``[H]`` at inference (what folding uses), or ``None`` if the gate cannot be folded."""
        raise NotImplementedError

    @torch.no_grad()
    def fold(self, weight: torch.Tensor) -> None:
        """Multiply ``weight[H, ...]`` (one slice per head) in place by ``inference()``."""
        factor = self.inference()
        if factor is None:
            raise TypeError(f"{type(self).__name__} has no inference value and cannot be folded")
        weight.mul_(factor.detach().to(weight).reshape(-1, *([1] * (weight.dim() - 1))))

    def forward(self, out: torch.Tensor) -> torch.Tensor:
        return out * self.values().to(device=out.device, dtype=out.dtype)[..., None]


class HeadGate(Gate, HeadOp):
    """A learnable scale per head, initialised to ones (attaching it changes nothing)."""

    op_type = "gate"

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(num_heads))

    def spec(self) -> dict:
        return {"num_heads": self.weight.numel()}

    def select_heads(self, keep: torch.Tensor) -> None:
        """Follow a head removal: keep only the entries of ``keep``."""
        self.weight = nn.Parameter(self.weight.detach()[keep.to(self.weight.device)].clone())

    def values(self) -> torch.Tensor:
        return self.weight

    def inference(self) -> torch.Tensor:
        return self.weight


class HeadMask(Gate, HeadOp):
    """A fixed per-head 0/1 factor (a buffer, not trained)."""

    op_type = "mask"

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.register_buffer("mask", torch.ones(num_heads))

    def spec(self) -> dict:
        return {"num_heads": self.mask.numel()}

    def select_heads(self, keep: torch.Tensor) -> None:
        self.mask = self.mask[keep.to(self.mask.device)].clone()

    def values(self) -> torch.Tensor:
        return self.mask

    def inference(self) -> torch.Tensor:
        return self.mask


class LayerCounted(Protocol):
    calls: int


def layer_of(helper: LayerCounted, n_layers: int) -> int:
    """The layer (0-based, within the site) of the current call, then count it.

    A module serving several layers (ALBERT) is called once per layer in every forward, so call ``k`` of a forward
    belongs to the site's ``k``-th layer (the attaching code resets ``calls`` at the start of every forward).
    """
    k = helper.calls % n_layers
    helper.calls += 1
    return k


class RowGate(Gate):
    """``out[b, :, h] *= weight[layer, b, h]`` for ``weight[n_layers, B | 1, H]``: one gate per layer and sample.

    Transient (never saved, never folded): gradient importance and ablation sweeps set ``weight`` to a plain tensor
    (possibly a view of a leaf that requires grad). Call ``k`` of a forward uses ``weight[k % n_layers]``.
    """

    def __init__(self, n_layers: int, num_heads: int) -> None:
        super().__init__()
        self.n_layers, self.num_heads, self.calls = n_layers, num_heads, 0
        self.weight = torch.ones(n_layers, 1, num_heads)

    def values(self) -> torch.Tensor:
        return self.weight[layer_of(self, self.n_layers)][:, None, :]

    def inference(self) -> None:
        return None

    def forward(self, out: torch.Tensor) -> torch.Tensor:
        w = self.values()
        if w.shape[0] not in (1, out.shape[0]):
            raise RuntimeError(f"gate weights for {w.shape[0]} samples, batch has {out.shape[0]}")
        return out * w.to(device=out.device, dtype=out.dtype)[..., None]


def add_gates(model: nn.Module, sites: "list[AttentionSite | str] | None" = None, name: str = "gate", *,
              selection: Selection | None = None, kinds: list[str] | None = None,
              layers: list[int] | None = None) -> dict[str, HeadGate]:
    """Attach a ``HeadGate`` to each site of ``selection`` (all by default) and select the ``headwise``
    implementation; returns ``{site.path: gate}``. ``sites`` / ``kinds`` / ``layers``: the former spellings of
    the selection (deprecated)."""
    chosen = selection_of("add_gates", selection, sites=sites, kinds=kinds, layers=layers).sites(model)
    gates = {s.path: attach(s, "output", name, HeadGate(s.num_heads)) for s in chosen}
    enable(model)
    return gates


def remove_gates(model: nn.Module, name: str = "gate", missing_ok: bool = False) -> None:
    """Detach the gates called ``name`` (the model computes what it did before ``add_gates``); raises when there
    are none, unless ``missing_ok``."""
    detach_all(model, name, missing_ok)


def gates_of(model: nn.Module, name: str = "gate") -> dict[str, HeadGate]:
    """The gates called ``name`` currently attached, keyed by site path."""
    return attached(model, "output", name)
