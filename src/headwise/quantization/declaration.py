"""Attention quantization as the tools that do not run it see it (``headwise.declaration``): the planner tries
SPIQA's 3-bit clamped log quantizer and thresholding at 0.01."""

from ..declaration import Declaration, Planned
from .config import QuantizationConfig

QUANTIZATION = Declaration(name="quantization", config=QuantizationConfig, doc="docs/quantization.md",
                           examples=("headwise edit quantization --quantizer log --bits 4 --out minilm-log4",),
                           planned=Planned(order=50, label="quantized attention"))

DECLARATIONS = (QUANTIZATION,)
