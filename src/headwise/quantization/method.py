"""What attention quantization does under the method contract (declared in ``declaration.py``):
``headwise.apply(model, QuantizationConfig(...))``. ``headwise.plan`` tries SPIQA's 3-bit clamped log quantizer and
thresholding at 0.01."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..contract import MethodHooks, register
from ..declaration import Levels, PlanContext
from .apply import quantize_attention, quantizers_of, remove_quantization
from .config import QuantizationConfig
from .declaration import QUANTIZATION

PLANNED = ({"method": "linear_slog_clamped_midval", "bits": 3}, {"method": "none", "threshold": 0.01})


def quantizer_levels(model: nn.Module, context: PlanContext) -> Levels:
    configs = [QuantizationConfig(**fields) for fields in PLANNED]
    return Levels([(f"quant-{c.method}-{c.bits}b" if c.method != "none" else f"threshold-{c.threshold:g}", c)
                   for c in configs])


@register(QUANTIZATION)
class Quantization(MethodHooks):
    levels = staticmethod(quantizer_levels)

    def attach(self, model: nn.Module, config: QuantizationConfig) -> Any:
        return quantize_attention(model, config)

    def example(self, model: nn.Module) -> QuantizationConfig:
        return QuantizationConfig(method="linear_slog_clamped_midval", bits=3)

    def detach(self, model: nn.Module) -> None:
        remove_quantization(model)

    def present(self, model: nn.Module) -> bool:
        return bool(quantizers_of(model))

    def describe(self, config: QuantizationConfig) -> str:
        return f"attention {config.method} {config.bits}b" if config.method != "none" \
            else f"attention threshold {config.threshold}"
