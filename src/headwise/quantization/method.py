"""Attention quantization under the method contract: ``headwise.apply(model, QuantizationConfig(...))``.
``headwise.plan`` tries SPIQA's 3-bit clamped log quantizer and thresholding at 0.01."""

from __future__ import annotations

from torch import nn

from ..contract import register_method
from ..sweep import Levels, Sweep, SweepContext
from .apply import quantize_attention, quantizers_of, remove_quantization
from .config import QuantizationConfig

PLANNED = ({"method": "linear_slog_clamped_midval", "bits": 3}, {"method": "none", "threshold": 0.01})


def quantizer_levels(model: nn.Module, context: SweepContext) -> Levels:
    configs = [QuantizationConfig(**fields) for fields in PLANNED]
    return Levels([(f"quant-{c.method}-{c.bits}b" if c.method != "none" else f"threshold-{c.threshold:g}", c)
                   for c in configs])


def describe(config: QuantizationConfig) -> str:
    return f"attention {config.method} {config.bits}b" if config.method != "none" \
        else f"attention threshold {config.threshold}"


register_method("quantization", QuantizationConfig, lambda model, c: quantize_attention(model, c),
                remove=remove_quantization, present=lambda model: bool(quantizers_of(model)),
                example=lambda model: QuantizationConfig(method="linear_slog_clamped_midval", bits=3),
                sweep=Sweep(quantizer_levels, describe, order=50, label="quantized attention"))
