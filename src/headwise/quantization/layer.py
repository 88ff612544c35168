"""The probability op: pruning + quantization of ``probs[B, H, Tq, Tk]``, and an optional meter of its output."""

from __future__ import annotations

from typing import Any

import torch

from ..runtime import HeadOp
from .config import NONE, QuantizationConfig
from .functional import QUANTIZERS, prune

DISTINCT_CAP = 1 << 17  # stop collecting the union of output values beyond this many


def population(probs: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor | None:
    """Bool ``[B, H, Tq, Tk]``: the entries that are attention values (None: all of them).

    Masked keys are out; so are padding *queries* of self-attention, recognised by not attending to themselves
    (this covers left and right padding, unlike the reference's top-left ``n × n`` block).
    """
    if keep is None:
        return None
    valid = keep.expand_as(probs)
    if probs.shape[-1] == probs.shape[-2]:
        valid = valid & keep.diagonal(dim1=-2, dim2=-1)[..., None]
    return valid


def transform(probs: torch.Tensor, config: QuantizationConfig, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Prune, renormalise and quantize ``probs`` as ``config`` says (float32 result, same shape)."""
    a = probs.float()
    if config.threshold > 0:
        a = prune(a, config.threshold)
        if config.renormalize:
            a = a / a.sum(-1, keepdim=True).clamp(min=torch.finfo(a.dtype).tiny)
    if config.quantizer == NONE:
        return a
    method = QUANTIZERS[config.quantizer]
    options = {name: getattr(config, name) for name in method.options}
    if not method.data_dependent:
        return method.fn(a, config.bits, **options)
    if config.scope == "example":
        options.pop("scope", None)
        return torch.cat([method.fn(a[i : i + 1], config.bits, valid=None if valid is None else valid[i : i + 1],
                                    **options) for i in range(a.shape[0])])
    return method.fn(a, config.bits, valid=valid, **options)


class QuantMeter:
    """Running counts over the outputs of one op: exact zeros and entries per head (sparsity), and the distinct
    values of the first ``distinct_calls`` calls (``torch.unique`` is too slow to run on every call)."""

    def __init__(self, distinct_calls: int = 2) -> None:
        self.distinct_calls = distinct_calls
        self.zeros: torch.Tensor | None = None  # [H]
        self.total: torch.Tensor | None = None  # [H]
        self.calls = 0
        self.distinct_max = 0  # most distinct values in one call (one layer, one batch)
        self.values: torch.Tensor | None = None  # union of the values seen, up to DISTINCT_CAP

    @torch.no_grad()
    def update(self, out: torch.Tensor, valid: torch.Tensor | None) -> None:
        valid = torch.ones_like(out, dtype=torch.bool) if valid is None else valid
        zeros = ((out == 0) & valid).sum((0, 2, 3)).double()
        total = valid.sum((0, 2, 3)).double()
        self.zeros = zeros if self.zeros is None else self.zeros + zeros
        self.total = total if self.total is None else self.total + total
        if self.calls < self.distinct_calls:
            seen = torch.unique(out[valid])
            self.distinct_max = max(self.distinct_max, seen.numel())
            if self.values is None or self.values.numel() <= DISTINCT_CAP:
                self.values = seen if self.values is None else torch.unique(torch.cat([self.values, seen]))
        self.calls += 1


class AttentionQuantizer(HeadOp):
    """Probability op ``(probs[B, H, Tq, Tk], keep[B, 1|H, Tq, Tk] | None) -> probs``: SPIQA pruning and
    quantization (fake quant: the values are quantized, the storage stays float). ``keep=False`` entries are
    exactly 0 in the output and never part of a data-dependent population. Constructor: the fields of
    :class:`QuantizationConfig`."""

    op_type = "spiqa"

    def __init__(self, **options: Any) -> None:
        super().__init__()
        former = QuantizationConfig.FORMER  # a checkpoint's spec may hold a field's former name
        self.config = QuantizationConfig(**{former.get(k, k): v for k, v in options.items()})
        self.meter: QuantMeter | None = None

    def spec(self) -> dict[str, Any]:
        return self.config.to_dict()

    def extra_repr(self) -> str:
        return self.config.label

    def forward(self, probs: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        valid = population(probs, keep)
        out = transform(probs, self.config, valid)
        if keep is not None:
            out = out.masked_fill(~keep, 0)
        if self.meter is not None:
            self.meter.update(out, valid)
        return out.to(probs.dtype)
