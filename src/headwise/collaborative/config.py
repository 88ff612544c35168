"""What ``compress`` does, as one dataclass."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..contract import MethodConfig
from typing import Literal, Sequence


@dataclass
class CollaborativeConfig(MethodConfig):
    """Options of :func:`headwise.collaborative.compress`.

    With a calibration set the objective is the attention-score error on its tokens; without, the weight error.
    ``tol=0`` runs every ALS sweep with no host sync (GPUs, the ``meta`` device). T5's cross-attention cannot be
    converted: give ``kinds=["enc-self", "dec-self"]`` there.
    """

    dk: int | float = field(metadata={
        "help": "width of the shared query/key space (≥ heads × head_dim is exact), or a fraction 0 < dk < 1 of "
                "each site's heads × head_dim (rounded to an even width)"})
    kinds: Sequence[str] | None = field(default=None, metadata={
        "help": "convert only the sites of these attention kinds (default: every site)"})
    init: Literal["auto", "block", "hosvd"] = field(default="auto", metadata={
        "help": "closed-form start: block (per-head SVD, global truncation), hosvd (top singular subspaces of the "
                "unfoldings) or auto (block with calibration data, hosvd without)"})
    iterations: int = field(default=20, metadata={"help": "ALS sweeps after the closed-form start", "positive": True})
    tol: float = field(default=1e-6, metadata={
        "help": "ALS stops when the error improves by less than this (0: every sweep, no host sync)"})
    solver: Literal["als", "tensorly"] = field(default="als", metadata={
        "help": "als: factored, O(H·d·D·R) per sweep; tensorly: tensorly.parafac on the dense tensor"})
    ridge: float = field(default=1e-2, metadata={
        "help": "regularisation of the input covariances, relative to their mean eigenvalue"})
    batch_size: int = field(default=32, metadata={"help": "calibration texts per forward pass"})
    max_length: int = field(default=128, metadata={"help": "tokens kept per calibration text"})

    def __post_init__(self) -> None:
        self.kinds = self.merge_kinds(self.kinds)
