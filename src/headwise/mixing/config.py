"""``MixingConfig``: where alpha mixers are attached; ``NuclearNormTraining``: how the nuclear-norm term trains them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal, Sequence, get_args

from ..contract import MethodConfig
from ..errors import HeadwiseError
from ..sites.selection import KINDS

Direction, Form = Literal["grow", "shrink"], Literal["radius", "seed"]
DIRECTIONS, FORMS = get_args(Direction), get_args(Form)


@dataclass
class MixingConfig(MethodConfig):
    """Where ``add_mixers`` attaches alpha mixers (how they train: ``NuclearNormTraining``)."""

    MOVED: ClassVar[dict[str, str]] = dict.fromkeys(
        ("gamma", "ratios", "start", "radius", "direction", "form"), "NuclearNormTraining")

    kinds: Sequence[str] | None = field(default=None, metadata={
        "help": "attention kinds that get a mixer (default: every site)"})

    def __post_init__(self) -> None:
        self.kinds = self.merge_kinds(self.kinds)
        check_kinds(self.kinds or (), "kinds")


@dataclass
class NuclearNormTraining:
    """How ``NuclearNormPenalty`` trains the mixers: the weight, start and form of the nuclear-norm term
    (``headwise.mixing.penalty`` gives the formulas)."""

    gamma: float = field(default=0.0, metadata={
        "help": "weight γ of the nuclear-norm term (0: the alphas train on the task loss alone)"})
    ratios: dict[str, float] = field(default_factory=dict, metadata={
        "help": "per-kind multiplier r_τ of the term, e.g. {\"dec-enc\": 0.5} (MHR's --*-alpha-loss-ratio; "
                "missing kinds count 1)"})
    start: float = field(default=0.0, metadata={
        "help": "fraction of training (0..1) before which the alphas stay frozen and the term is off (MHR's "
                "--loss-start-after)"})
    radius: float = field(default=1e-2, metadata={
        "help": "Δr: the growth per optimizer update the term asks for (form radius), or the constant offset of "
                "the seed's loss (form seed)"})
    direction: Direction = field(default="grow", metadata={
        "help": "grow pushes nuclear norms up (MHR); shrink pushes them down (a low-rank prior)"})
    form: Form = field(default="radius", metadata={
        "help": "radius: relu(Δr − s·(‖α‖_* − ‖α‖_*^prev)); seed: the reference code's Δr + s·(sg‖α‖_* − ‖α‖_*)"})

    def __post_init__(self) -> None:
        check_kinds(self.ratios, "ratios")
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


def check_kinds(kinds, what: str) -> None:
    """Refuse an unknown attention kind among ``kinds`` (the names of ``what``)."""
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise HeadwiseError(f"{what} name unknown attention kind {bad[0]!r}; use any of {', '.join(KINDS)}")
