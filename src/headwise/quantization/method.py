"""Attention quantization under the method contract: ``headwise.apply(model, QuantizationConfig(...))``."""

from __future__ import annotations

from ..contract import register_method
from .apply import quantize_attention, quantizers_of, remove_quantization
from .config import QuantizationConfig

register_method("quantization", QuantizationConfig, lambda model, c: quantize_attention(model, c),
                remove=remove_quantization, present=lambda model: bool(quantizers_of(model)),
                example=lambda model: QuantizationConfig(method="linear_slog_clamped_midval", bits=3))
