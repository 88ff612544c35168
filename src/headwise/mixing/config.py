"""``MixingConfig``: where alpha matrices go and how the nuclear-norm term treats them (peft-style dataclass)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..contract import MethodConfig
from ..errors import HeadwiseError
from ..sites import KINDS

DIRECTIONS = ("grow", "shrink")
FORMS = ("radius", "seed")


@dataclass
class MixingConfig(MethodConfig):
    """Options of ``add_mixers`` and ``NuclearNormPenalty``.

    - ``kinds``: attention kinds that get a mixer (``None``: every site).
    - ``gamma``: weight γ of the nuclear-norm term (0: alphas train on the task loss alone).
    - ``ratios``: per-kind multiplier r_τ of the term (MHR's ``--*-alpha-loss-ratio``; missing kinds count 1).
    - ``start``: fraction of training (0..1) before which alphas stay frozen at their current value and the term
      is off (MHR's ``--loss-start-after``, measured on the Trainer's real step count).
    - ``radius``: Δr, the growth per optimizer update the term asks for (``form="radius"``) or the constant
      offset of the seed's loss (``form="seed"``, no effect on gradients).
    - ``direction``: ``"grow"`` pushes nuclear norms up (MHR), ``"shrink"`` pushes them down (a low-rank prior).
    - ``form``: ``"radius"`` — ``relu(Δr − s·(‖α‖_* − ‖α‖_*^prev))``, active only while the last update
      moved the norm by less than Δr in the wanted direction; ``"seed"`` — the reference code's
      ``Δr + s·(sg‖α‖_* − ‖α‖_*)``, whose value is always Δr and whose gradient is ``−s·∇‖α‖_*``
      (s = +1 grow, −1 shrink).
    """

    kinds: Sequence[str] | None = None
    gamma: float = 0.0
    ratios: dict[str, float] = field(default_factory=dict)
    start: float = 0.0
    radius: float = 1e-2
    direction: str = "grow"
    form: str = "radius"

    def __post_init__(self) -> None:
        self.kinds = self.merge_kinds(self.kinds)
        if self.kinds is not None:
            bad = [k for k in self.kinds if k not in KINDS]
            if bad:
                raise HeadwiseError(f"unknown attention kind {bad[0]!r}; use any of {', '.join(KINDS)}")
        bad = [k for k in self.ratios if k not in KINDS]
        if bad:
            raise HeadwiseError(f"ratios name unknown attention kind {bad[0]!r}; use any of {', '.join(KINDS)}")
        if self.gamma < 0 or any(r < 0 for r in self.ratios.values()):
            raise HeadwiseError(f"gamma and ratios must be ≥ 0 (gamma={self.gamma}, ratios={self.ratios})")
        if not 0.0 <= self.start <= 1.0:
            raise HeadwiseError(f"start is a fraction of training in [0, 1], got {self.start}")
        if self.radius < 0:
            raise HeadwiseError(f"radius Δr must be ≥ 0, got {self.radius}")
        if self.direction not in DIRECTIONS:
            raise HeadwiseError(f"unknown direction {self.direction!r}; use one of {', '.join(DIRECTIONS)}")
        if self.form not in FORMS:
            raise HeadwiseError(f"unknown form {self.form!r}; use one of {', '.join(FORMS)}")

    def ratio(self, kind: str) -> float:
        return float(self.ratios.get(kind, 1.0))

    @property
    def sign(self) -> float:
        return 1.0 if self.direction == "grow" else -1.0
