"""The projections of a latent key/value site: keys and values decoded from one shared latent per token.

``down: x[D] → c[r]`` is shared by ``k_proj`` and ``v_proj``; each decodes its heads with ``up: c → [rows]``.
Keys may keep some rotary rows outside the latent (``rope``: read from ``x`` directly). The rotary embedding is
applied by the attention module after decoding, as before, so a full-rank latent is exact. What a latent cache
stores per token and layer: ``c`` and the ``rope`` rows (``conversion.cache.LatentCache``, which receives ``c``
through :func:`take_latent`).
"""

from __future__ import annotations

import weakref
import torch
from torch import nn

# projection → the latent caches' layers that read its latent (held weakly), and its latest latent while one lives
_READERS: "weakref.WeakKeyDictionary[nn.Module, weakref.WeakSet]" = weakref.WeakKeyDictionary()
_LATEST: "weakref.WeakKeyDictionary[nn.Module, torch.Tensor]" = weakref.WeakKeyDictionary()


def watch_latent(projection: "LatentProjection", reader: object) -> None:
    """While ``reader`` lives, ``projection`` keeps its latest latent ``[B, T, r]`` for :func:`take_latent`."""
    _READERS.setdefault(projection, weakref.WeakSet()).add(reader)


def take_latent(projection: "LatentProjection") -> torch.Tensor | None:
    """The latent of ``projection``'s latest forward (once; None when nothing was kept)."""
    return _LATEST.pop(projection, None)


class LatentProjection(nn.Module):
    """``out[..., order] = cat(rope(x), up(down(x)))``: ``[B, T, D] → [B, T, out_features]``.

    ``order[out]`` (long buffer) puts the rope rows and the decoded rows back in the head layout."""

    def __init__(self, down: nn.Linear, up: nn.Linear, rope: nn.Linear | None, order: torch.Tensor) -> None:
        super().__init__()
        self.down, self.up, self.rope = down, up, rope
        self.register_buffer("order", order.long())
        self.in_features, self.out_features = down.in_features, order.numel()
        self._head: tuple[tuple, torch.Tensor] | None = None  # (weight stamp, head-layout decoder): head_rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        latent = self.down(x)
        if _READERS.get(self):
            _LATEST[self] = latent
        decoded = self.up(latent)
        parts = [self.rope(x), decoded] if self.rope is not None else [decoded]
        return torch.cat(parts, -1)[..., self.order]

    def _dense(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        weight = self.up.weight @ self.down.weight
        bias = None if self.down.bias is None else self.up.weight @ self.down.bias
        if self.rope is not None:
            weight = torch.cat([self.rope.weight, weight])
            bias = None if bias is None else torch.cat([self.rope.bias, bias])
        return weight[self.order], None if bias is None else bias[self.order]

    def head_rows(self) -> torch.Tensor:
        """The decoder ``[out_features, r]`` in head layout, zero on the rope rows: what a latent cache decodes the
        held latents with. ``up.weight`` itself when its rows are already in head layout (values), else one copy kept
        by this module for every cache (keys: their rope rows sit between the decoded ones), rebuilt only when the
        weight changed. A cache never copies weights."""
        weight = self.up.weight
        if self.rope is None and weight.shape[0] == self.out_features and (
                weight.is_meta or torch.equal(self.order, torch.arange(self.out_features, device=self.order.device))):
            return weight
        stamp = (weight.data_ptr(), weight._version, weight.device, weight.dtype, self.order._version)
        if self._head is None or self._head[0] != stamp:
            rows = torch.cat([weight.new_zeros(self.rope_rows, weight.shape[1]), weight.detach()])[self.order]
            self._head = (stamp, rows)
        return self._head[1]

    @property
    def weight(self) -> torch.Tensor:
        """The equivalent dense ``[out, D]`` weight (a copy: per-head views of a latent site are read-only)."""
        return self._dense()[0]

    @property
    def bias(self) -> torch.Tensor | None:
        return self._dense()[1]

    @property
    def rank(self) -> int:
        return self.down.out_features

    @property
    def rope_rows(self) -> int:
        return 0 if self.rope is None else self.rope.out_features

    def extra_repr(self) -> str:
        return f"in={self.in_features}, rank={self.rank}, rope_rows={self.rope_rows}, out={self.out_features}"


def is_latent(module: nn.Module) -> bool:
    return isinstance(getattr(module, "k_proj", None), LatentProjection)
