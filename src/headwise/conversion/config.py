"""What ``convert_gqa`` and ``convert_latent`` do, as dataclasses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..contract import MethodConfig
from ..errors import HeadwiseError

Grouping = Literal["contiguous", "similarity"]
Init = Literal["mean", "svd", "calibrated"]


@dataclass
class GQAConfig(MethodConfig):
    """Options of :func:`headwise.convert_gqa`.

    ``kv_heads``: key/value heads per layer after conversion (must divide the query heads).
    ``grouping``: ``"contiguous"`` (query heads ``[j·g, (j+1)·g)`` share key/value head ``j``) or ``"similarity"``
    (query heads whose keys and values are most alike share one; the query heads and output-projection columns
    are permuted so each group is contiguous, which does not change the function).
    ``init``: ``"mean"`` (average the keys/values of a group, GQA paper), ``"svd"`` (best shared projection in
    weight space, compensated in q/o) or ``"calibrated"`` (the same fit on the input statistics of a
    calibration set, weighted by the query energy per rotary frequency and by the output projection).
    ``ridge``: regularises input covariances, relative to their mean eigenvalue.
    """

    kv_heads: int
    grouping: Grouping = "contiguous"
    init: Init = "calibrated"
    ridge: float = 1e-4

    def __post_init__(self) -> None:
        if not isinstance(self.kv_heads, int) or isinstance(self.kv_heads, bool) or self.kv_heads < 1:
            raise HeadwiseError(f"kv_heads {self.kv_heads!r} must be a positive integer")
        self.whole_model("convert_gqa (every decoder self-attention)")


@dataclass
class LatentConfig(MethodConfig):
    """Options of :func:`headwise.convert_latent`.

    Give exactly one of ``kv_budget`` (fraction of today's key/value cache bytes, ``0 < b ≤ 1``) or ``rank``
    (width of the cached latent per token and layer). ``rope_pairs``: rotary frequency pairs per key/value head
    kept outside the latent (cached as they are); the rest of the keys and all values share one latent.
    ``init``: ``"svd"`` (weight space) or ``"calibrated"`` (input statistics of a calibration set).
    """

    kv_budget: float | None = None
    rank: int | None = None
    rope_pairs: int = 0
    init: Literal["svd", "calibrated"] = "calibrated"
    ridge: float = 1e-4

    def __post_init__(self) -> None:
        self.whole_model("convert_latent (every decoder self-attention)")

