"""What ``compress`` does, as one dataclass."""

from __future__ import annotations

from dataclasses import dataclass

from ..contract import MethodConfig
from typing import Literal, Sequence


@dataclass
class CollaborativeConfig(MethodConfig):
    """Options of :func:`headwise.collaborative.compress`.

    ``dk``: width of the shared query/key space (``≥ H·d`` is the exact reparametrisation), or a fraction
    ``0 < dk < 1`` of each site's ``H·d`` (rounded to an even width).
    ``init``: ``"block"`` (best form where every shared dimension serves one head: per-head SVD, global
    truncation), ``"hosvd"`` (top singular subspaces of the unfoldings) or ``"auto"`` (block with a calibration
    set, hosvd without: what converged best on MiniLM). ``iterations`` of ALS follow
    (``solver="als"``: factored, ``O(H·d·D·R)`` per sweep; ``"tensorly"``: ``tensorly.parafac`` on the dense tensor).
    ALS stops when the error improves by less than ``tol`` (read on the host each sweep); ``tol=0`` runs every
    sweep with no host sync (GPUs, the ``meta`` device).
    With a calibration set the objective is the attention-score error on its tokens (``ridge`` regularises the
    input covariances, relative to their mean eigenvalue); without, the weight error. ``kinds``: convert only
    the sites of these attention kinds (None: every site), e.g. ``["dec-enc"]`` in BART/Marian, or
    ``["enc-self", "dec-self"]`` in T5, whose cross-attention cannot be converted.
    """

    dk: int | float
    kinds: Sequence[str] | None = None
    init: Literal["auto", "block", "hosvd"] = "auto"
    iterations: int = 20
    tol: float = 1e-6
    solver: Literal["als", "tensorly"] = "als"
    ridge: float = 1e-2
    batch_size: int = 32
    max_length: int = 128

    def __post_init__(self) -> None:
        self.kinds = self.merge_kinds(self.kinds)
