"""What ``convert_gqa`` and ``convert_latent`` do, as dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..contract import MethodConfig
from ..errors import HeadwiseError

Grouping = Literal["contiguous", "similarity"]
Init = Literal["mean", "svd", "calibrated"]


@dataclass
class GQAConfig(MethodConfig):
    """Options of :func:`headwise.convert_gqa`.

    ``"similarity"`` grouping permutes the query heads and output-projection columns so each group is contiguous,
    which does not change the function. ``"calibrated"`` weighs the fit by the query energy per rotary frequency
    and by the output projection.
    """

    kv_heads: int = field(metadata={"help": "key/value heads per layer after conversion (must divide the query heads)",
                                    "positive": True})
    grouping: Grouping = field(default="contiguous", metadata={
        "help": "which query heads share a key/value head: contiguous ranges, or those whose keys and values are "
                "most alike (similarity)"})
    init: Init = field(default="calibrated", metadata={
        "help": "mean: average the keys/values of a group (GQA paper); svd: best shared projection in weight space; "
                "calibrated: the same fit on the input statistics of calibration data",
        "flag": "--gqa-init", "former": "--init"})
    ridge: float = field(default=1e-4, metadata={
        "help": "regularisation of the input covariances, relative to their mean eigenvalue"})

    def __post_init__(self) -> None:
        if not isinstance(self.kv_heads, int) or isinstance(self.kv_heads, bool) or self.kv_heads < 1:
            raise HeadwiseError(f"kv_heads {self.kv_heads!r} must be a positive integer")
        self.whole_model("convert_gqa (every decoder self-attention)")


@dataclass
class LatentConfig(MethodConfig):
    """Options of :func:`headwise.convert_latent`.

    Give exactly one of ``kv_budget`` or ``rank``; the keys outside ``rope_pairs`` and all values share one latent.
    """

    kv_budget: float | None = field(default=None, metadata={
        "help": "share of today's key/value cache bytes to keep, 0 < b ≤ 1 (or give rank)"})
    rank: int | None = field(default=None, metadata={
        "help": "width of the cached latent per token and layer (instead of kv_budget)", "positive": True})
    rope_pairs: int = field(default=0, metadata={
        "help": "rotary frequency pairs per key/value head kept outside the latent (cached as they are)"})
    init: Literal["svd", "calibrated"] = field(default="calibrated", metadata={
        "help": "svd: fit in weight space; calibrated: fit on the input statistics of calibration data",
        "flag": "--latent-init", "former": "--init"})
    ridge: float = field(default=1e-4, metadata={
        "help": "regularisation of the input covariances, relative to their mean eigenvalue"})

    def __post_init__(self) -> None:
        self.whole_model("convert_latent (every decoder self-attention)")

