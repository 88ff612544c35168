"""Attaching quantizers to a model, and measuring what they do (sparsity, distinct values)."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import nn

from ..contract import with_keywords
from ..errors import HeadwiseError
from ..runtime import attach, detach_all, enable
from ..runtime.ops import attached
from ..sites import AttentionSite, selection_of
from .config import QuantizationConfig
from .layer import DISTINCT_CAP, AttentionQuantizer, QuantMeter

NAME = "spiqa"


def quantize_attention(model: nn.Module, config: QuantizationConfig | None = None, *,
                       sites: "list[AttentionSite | str] | None" = None, name: str = NAME,
                       **options: Any) -> dict[str, AttentionQuantizer]:
    """Attach an :class:`AttentionQuantizer` to every site of the selection (all by default), replacing one of the
    same ``name``, and select the ``headwise`` attention implementation. ``options``: ``config`` fields
    (``quantizer=``, ``bits=``, ``threshold=``, ``selection=`` ...; one that conflicts with ``config`` raises);
    ``sites``: the former spelling of the selection (deprecated). Returns ``{site.path: op}``; undo with
    :func:`remove_quantization`. ``headwise.save_pretrained`` saves the ops with the model."""
    if sites is not None:  # the former spelling of the selection (deprecated)
        options["selection"] = selection_of("quantize_attention", options.get("selection"), sites=sites)
    cfg = with_keywords(QuantizationConfig, config, **options)
    chosen = cfg.sites(model)
    ops = {s.path: attach(s, "prob", name, AttentionQuantizer(**cfg.to_dict()), replace=True) for s in chosen}
    enable(model)
    return ops


def quantizers_of(model: nn.Module, name: str = NAME) -> dict[str, AttentionQuantizer]:
    """The quantizers called ``name`` currently attached, keyed by site path."""
    return attached(model, "prob", name)


def remove_quantization(model: nn.Module, name: str = NAME, missing_ok: bool = False) -> None:
    """Detach every quantizer called ``name``; raises when there are none, unless ``missing_ok``."""
    detach_all(model, name, missing_ok)


@dataclass
class Measurement:
    """What the quantizers output while measured. ``sparsity``: share of attention values (padding excluded)
    that are exactly 0, over all sites and heads (equal to the mean of the per-head shares, since every head of
    a forward sees the same tokens); ``per_head``: ``{site.path: [share per head]}``; ``distinct``: most distinct
    values one layer produced in one forward; ``distinct_union``: distinct values over all measured calls
    (None beyond 2^17)."""

    meters: dict[str, QuantMeter]

    @property
    def sparsity(self) -> float:
        zeros = sum(float(m.zeros.sum()) for m in self.meters.values() if m.zeros is not None)
        total = sum(float(m.total.sum()) for m in self.meters.values() if m.total is not None)
        return zeros / total if total else float("nan")

    @property
    def per_head(self) -> dict[str, list[float]]:
        return {path: (m.zeros / m.total.clamp(min=1)).tolist() for path, m in self.meters.items()
                if m.zeros is not None}

    @property
    def distinct(self) -> int:
        return max((m.distinct_max for m in self.meters.values()), default=0)

    @property
    def distinct_union(self) -> int | None:
        parts = [m.values for m in self.meters.values() if m.values is not None]
        if not parts:
            return 0
        union = torch.unique(torch.cat(parts)).numel()
        return None if union > DISTINCT_CAP else union


@contextmanager
def measuring(model: nn.Module, name: str = NAME, distinct_calls: int = 2) -> Iterator[Measurement]:
    """Count what the attached quantizers output during the block (see :class:`Measurement`)."""
    ops = quantizers_of(model, name)
    if not ops:
        raise HeadwiseError(f"no quantizer named {name!r} is attached; call quantize_attention(model, ...) first")
    measurement = Measurement({path: QuantMeter(distinct_calls) for path in ops})
    for path, op in ops.items():
        op.meter = measurement.meters[path]
    try:
        yield measurement
    finally:
        for op in ops.values():
            op.meter = None
