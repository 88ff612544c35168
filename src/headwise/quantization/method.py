"""What attention quantization does under the method contract (declared in ``declaration.py``):
``headwise.apply(model, QuantizationConfig(...))``. ``headwise.plan`` tries SPIQA's 3-bit clamped log quantizer and
thresholding at 0.01."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..contract import MethodHooks, register
from ..declaration import Levels, PlanContext
from .attach import quantize_attention, quantizers_of, remove_quantization
from .config import QuantizationConfig
from .declaration import QUANTIZATION

PLANNED = ({"quantizer": "linear_slog_clamped_midval", "bits": 3}, {"quantizer": "none", "threshold": 0.01})


def quantizer_levels(model: nn.Module, context: PlanContext) -> Levels:
    configs = [QuantizationConfig(**fields) for fields in PLANNED]
    return Levels([(f"quant-{c.quantizer}-{c.bits}b" if c.quantizer != "none" else f"threshold-{c.threshold:g}", c)
                   for c in configs])


@register(QUANTIZATION)
class Quantization(MethodHooks):
    levels = staticmethod(quantizer_levels)

    def attach(self, model: nn.Module, config: QuantizationConfig) -> Any:
        return quantize_attention(model, config)

    def example(self, model: nn.Module) -> QuantizationConfig:
        return QuantizationConfig(quantizer="linear_slog_clamped_midval", bits=3)

    def detach(self, model: nn.Module) -> None:
        remove_quantization(model)

    def present(self, model: nn.Module) -> bool:
        return bool(quantizers_of(model))

    def describe(self, config: QuantizationConfig) -> str:
        return f"attention {config.quantizer} {config.bits}b" if config.quantizer != "none" \
            else f"attention threshold {config.threshold}"
