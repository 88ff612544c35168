"""``QuantizationConfig``: what a quantizer op does, in one validated dataclass (peft-style). No torch: the command
line reads it to build its options; the quantizers' names come from ``functional`` when a config is checked."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

from ..contract import MethodConfig
from ..errors import HeadwiseError, renamed_fields

FLOOR = 1e-3  # p_min of the "clamped" / "with pruning" variants (functional's default too)
NONE = "none"  # threshold pruning only
# Short names next to SPIQA's; a trailing number sets the bits ("log3" = linear_slog_clamped_midval, 3 bits).
ALIASES: dict[str, str] = {"log": "linear_slog_clamped_midval", "lin": "linear_slinear_clamped_midval",
                           "ulog": "uniform_slog_mean", "ulin": "uniform_slinear_clamped_mean",
                           "bin": "binarization", "prune": NONE}
TopEdge, Scope = Literal["reference", "clamp"], Literal["tensor", "example", "row"]
Zeros, BinValue = Literal["reference", "keep"], Literal["reference", "mean"]
CHOICES = {"top_edge": get_args(TopEdge), "scope": get_args(Scope), "zeros": get_args(Zeros),
           "bin_value": get_args(BinValue)}


def method_names() -> tuple[str, ...]:
    """Every quantizer's SPIQA name (``functional.QUANTIZERS``), then ``"none"``."""
    from .functional import QUANTIZERS

    return (*QUANTIZERS, NONE)


def __getattr__(name: str) -> Any:
    if name == "METHOD_NAMES":  # read from the quantizers, which import torch, on first use
        return method_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def resolve_method(name: str, bits: int) -> tuple[str, int]:
    """``(SPIQA method name, bits)`` for a method name or alias: ``"log3"`` → ``("linear_slog_clamped_midval", 3)``."""
    names = method_names()
    if name in names:
        return name, bits
    stem = name.rstrip("0123456789")
    if stem in ALIASES:
        return ALIASES[stem], int(name[len(stem):]) if name != stem else bits
    raise HeadwiseError(f"unknown quantization method {name!r}; valid: {', '.join(names)}, or a short name "
                        f"{', '.join(ALIASES)} with optional bits (e.g. log3)")


@renamed_fields(method="quantizer")
@dataclass
class QuantizationConfig(MethodConfig):
    """Options of the attention-probability quantizer attached by ``quantize_attention``.

    Per forward, on every attached site: ``A ← A·1[A > threshold]`` (if ``threshold > 0``), then row
    renormalisation (if ``renormalize``), then the ``quantizer`` with ``bits``; keys that may not be attended
    (padding, causal mask) stay exactly 0.

    ``quantizer`` (formerly ``method``) is stored as the SPIQA name; its default is the one hard-wired in the
    published code, 3-bit log scale with pruning below 1e-3. A row pruned to nothing stays 0; padding is never a value.
    """

    quantizer: str = field(default="linear_slog_clamped_midval", metadata={
        "help": "a SPIQA quantizer (headwise.quantization.QUANTIZERS), none (pruning only), or a short name log, lin, "
                "ulog, ulin, bin, prune with optional bits (log3)", "former": "--method"})
    bits: int = field(default=3, metadata={"help": "bits of the quantizer, 1 to 16 (ignored by binarization)"})
    threshold: float = field(default=0.0, metadata={
        "help": "pruning threshold in [0, 1): probabilities ≤ it become 0 before quantizing (0: off)"})
    renormalize: bool = field(default=False, metadata={
        "help": "after pruning, divide each row by its new sum (off in the seed)"})
    floor: float = field(default=FLOOR, metadata={
        "help": "pruning floor p_min of the quantizers with pruning and of linear_slog"})
    top_edge: TopEdge = field(default="reference", metadata={
        "help": "inputs of exactly 1.0: as published (reference) or the top level (clamp)"})
    scope: Scope = field(default="tensor", metadata={
        "help": "population of the data-dependent quantizers: the layer's whole batch (tensor, published), each "
                "example alone, or per row (binarization only)"})
    zeros: Zeros = field(default="reference", metadata={
        "help": "uniform_slog_mean: exact zeros take the lowest level (reference) or stay 0 (keep)"})
    bin_value: BinValue = field(default="reference", metadata={
        "help": "uniform_slinear_clamped_mean: bin midpoints (reference) or bin means"})

    def __post_init__(self) -> None:
        from .functional import QUANTIZERS

        if isinstance(self.quantizer, str):
            self.quantizer, self.bits = resolve_method(self.quantizer, self.bits)
        if self.quantizer not in method_names():
            raise HeadwiseError(f"unknown quantizer {self.quantizer!r}; valid: {', '.join(method_names())}")
        if isinstance(self.bits, bool) or not isinstance(self.bits, int) or not 1 <= self.bits <= 16:
            raise HeadwiseError(f"bits must be an integer from 1 to 16, got {self.bits!r}")
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, (int, float)) \
                or not 0 <= self.threshold < 1:
            raise HeadwiseError(f"threshold must lie in [0, 1) (0 = no pruning), got {self.threshold!r}")
        self.threshold = float(self.threshold)
        if not isinstance(self.floor, (int, float)) or not 0 < self.floor < 1:
            raise HeadwiseError(f"floor must lie in (0, 1), got {self.floor!r}")
        self.floor = float(self.floor)
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise HeadwiseError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if self.scope == "row" and self.quantizer in QUANTIZERS and QUANTIZERS[self.quantizer].data_dependent \
                and self.quantizer != "binarization":
            raise HeadwiseError(f"scope='row' applies to binarization only; use 'tensor' or 'example' for "
                                f"{self.quantizer}")

    def to_dict(self) -> dict[str, Any]:
        """The quantizer's options (what an ``AttentionQuantizer`` is built from; the selection is not one)."""
        options = asdict(self)
        del options["selection"]
        return options

    @property
    def label(self) -> str:
        """Short description, e.g. ``linear_slog_clamped_midval 3b`` or ``prune >0.01``."""
        parts = [] if self.quantizer == NONE else [self.quantizer if self.quantizer == "binarization"
                                                    else f"{self.quantizer} {self.bits}b"]
        if self.threshold:
            parts.append(f"prune >{self.threshold:g}")
        return ", ".join(parts) or "unchanged"

