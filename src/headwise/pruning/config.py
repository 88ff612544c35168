"""The pruning family's configs: what is attached or removed (``GateConfig``, ``MaskConfig``, ``L0Config``,
``PruneHeadsConfig``) and how the L0 gates train (``L0Training``). No torch: the command line reads them to build
its options."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Sequence, get_args

from ..contract import MethodConfig
from ..errors import HeadwiseError
from ..runtime.defaults import EPS, STRETCH, TEMPERATURE

Reduction = Literal["sum", "mean_over_modules"]
REDUCTIONS = get_args(Reduction)


@dataclass
class L0Config(MethodConfig):
    """What ``add_l0_gates`` attaches: a Hard-Concrete gate per head (how they train: ``L0Training``)."""

    MOVED: ClassVar[dict[str, str]] = dict.fromkeys(
        ("lam", "reduction", "target_heads", "lambda_lr", "target_warmup"), "L0Training")

    kinds: Sequence[str] | None = field(default=None, metadata={
        "help": "gate only these attention kinds (Voita's concrete_heads; default: every site)"})
    temperature: float = field(default=TEMPERATURE, metadata={
        "help": "Hard-Concrete temperature β of the gates", "flag": "--gate-temperature", "former": "--temperature",
        "positive": True})
    stretch: tuple[float, float] = field(default=STRETCH, metadata={
        "help": "Hard-Concrete stretch interval (l, r) of the gates, l < 0 < 1 < r"})
    eps: float = field(default=EPS, metadata={"help": "clamp of the gates' uniform noise away from 0 and 1"})
    init: str | float = field(default="voita", metadata={
        "help": "initial log α of every gate: 'voita' (the reference initialisation) or a number",
        "flag": "--gate-init", "former": "--init"})

    def __post_init__(self) -> None:
        self.kinds = self.merge_kinds(self.kinds)


@dataclass
class L0Training:
    """How the L0 gates train (``L0Penalty``): the coefficient λ, its reduction and its dual-ascent target."""

    lam: float = field(default=0.1, metadata={"help": "L0 coefficient λ (the start value with target_heads)"})
    reduction: Reduction = field(default="sum", metadata={
        "help": "sum of the open probabilities over every gated head (the paper) or divided by the gated modules "
                "(the reference code)"})
    target_heads: int | None = field(default=None, metadata={
        "help": "heads expected open at the end: λ follows dual ascent towards it (default: a fixed λ)"})
    lambda_lr: float = field(default=0.01, metadata={"help": "dual-ascent step of λ per optimizer step"})
    target_warmup: int = field(default=0, metadata={
        "help": "optimizer steps over which the target moves linearly from every head to target_heads"})

    def __post_init__(self) -> None:
        if self.lam < 0:
            raise HeadwiseError(f"the L0 coefficient λ must be ≥ 0, got {self.lam}")
        if self.reduction not in REDUCTIONS:
            raise HeadwiseError(f"unknown reduction {self.reduction!r}; use one of {', '.join(REDUCTIONS)}")
        if self.target_heads is not None and self.target_heads < 1:
            raise HeadwiseError(f"target_heads must be ≥ 1, got {self.target_heads}")
        if self.lambda_lr <= 0:
            raise HeadwiseError(f"lambda_lr must be > 0, got {self.lambda_lr}")
        if self.target_warmup < 0:
            raise HeadwiseError(f"target_warmup must be ≥ 0 steps, got {self.target_warmup}")



@dataclass
class GateConfig(MethodConfig):
    """A learnable scale per head (``HeadGate``, initialised to 1) on the selected sites."""


@dataclass
class MaskConfig(MethodConfig):
    """Fixed 0/1 head masks: ``masks`` is a ``MaskSpec`` (``{"enc-self.3": [1, 0, ...]}`` or Voita's per-kind
    ``{"enc-self": [[...], ...]}``); the keys are the selection."""

    masks: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "0/1 mask per head, by site ({\"enc-self.3\": [1, 0, ...]}) or per kind, one row per layer "
                "({\"enc-self\": [[...], ...]})"})

    def __post_init__(self) -> None:
        if not isinstance(self.masks, dict) or not self.masks:
            raise HeadwiseError("masks is empty: give at least one site or kind, e.g. {'enc-self.0': [1, 0, 1, ...]}")
        self.whole_model("masks (their keys select the sites)")


@dataclass
class PruneHeadsConfig(MethodConfig):
    """Physical removal of heads: ``heads`` is ``{site name or path: [head indices]}`` (weights shrink for good)."""

    heads: dict[str, list[int]] = field(default_factory=dict, metadata={
        "help": "heads to remove, {site name or path: [head indices]}, e.g. {\"enc-self.0\": [0, 1]}"})
    allow_empty_layers: bool = field(default=False, metadata={
        "help": "allow removing every head of a layer (its attention sublayer then only adds its output bias)"})

    def __post_init__(self) -> None:
        if not isinstance(self.heads, dict) or not self.heads:
            raise HeadwiseError("heads is empty: give {site: [head indices]}, e.g. {'enc-self.0': [3]}")
        bad = next((k for k, v in self.heads.items() if not isinstance(v, list) or not all(
            isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in v)), None)
        if bad is not None:
            raise HeadwiseError(f"heads[{bad!r}] is {self.heads[bad]!r}; give a list of head indices (integers ≥ 0)")
        self.whole_model("prune_heads (its keys select the sites)")

    @property
    def removed(self) -> int:
        return sum(len(h) for h in self.heads.values())
