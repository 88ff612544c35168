"""What a method declares for ``headwise.plan``: a ``Sweep`` (``register_method(..., sweep=Sweep(...))``).

>>> Sweep(levels=my_levels, describe=lambda c: f"scale {c.scale:g}", order=35, role="pair")

The planner asks every registered method that has a sweep for its ``levels(model, context)`` (named configs,
each one edit of the whole model), applies each through ``headwise.apply`` in place, measures it on the task (score,
then the costs counted on the edited model: heads, attention parameters, FLOPs, KV bytes, latency beside the
unedited model), and combines levels by ``role``. A plan is made of the method records these configs give
(``contract.config_to_dict``), so a method with a sweep is planned, applied and saved with no planner file touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

from .errors import HeadwiseError

Role = Literal["heads", "pair", "alone"]
ROLES: tuple[str, ...] = ("heads", "pair", "alone")


@dataclass(frozen=True)
class SweepContext:
    """What the planner knows when it asks a method for its levels.

    ``removal_order``: removal units, least important first (``[site name, [query heads]]``, a whole key/value
    group where heads share one); ``budget_heads``: the heads the budget keeps (None: no head limit);
    ``sequence_length``: mean real tokens per calibration sequence; ``allow_empty_layers``: a removal may empty a
    layer; ``error(configs)``: the relative output error ``‖y − ŷ‖/‖y‖`` on the probe batches of the configs
    applied in place (the model is restored after); ``progress``: show progress (None: when a terminal)."""

    removal_order: Sequence[Sequence[Any]]
    budget_heads: int | None
    sequence_length: float
    allow_empty_layers: bool
    error: Callable[[Sequence[Any]], float]
    progress: bool | None = None


@dataclass
class Levels:
    """A method's answer: ``configs`` as ``(point name, config)`` (names unique in a plan, e.g. ``"dk-0.25"``);
    ``why_none``: why there are none on this model (the plan shows it under "not tried"); ``site_proxy``: a
    per-site number the method measured to choose its levels (the plan report shows it as a column named
    ``proxy_label``)."""

    configs: list[tuple[str, Any]] = field(default_factory=list)
    why_none: str | None = None
    site_proxy: dict[str, float] = field(default_factory=dict)
    proxy_label: str = ""


@dataclass(frozen=True)
class Sweep:
    """How ``headwise.plan`` uses a method.

    ``levels(model, context) -> Levels``: the configs to measure on ``model`` (see ``SweepContext``).
    ``describe(config) -> str``: a few words for reports (``"remove 36 heads"``).
    ``order``: where the method goes in a combined edit (lower first; heads removed 10, KV merge 20, collaborative
    30, mechanism 40, quantization 50).
    ``role``: ``"heads"`` (its levels are the head-removal axis), ``"pair"`` (each level is also measured on top
    of the head-removal levels: predicted first, the best inside the budget measured) or ``"alone"``.
    ``calibrated``: applying it needs calibration batches (``headwise.apply(..., calibration=batches)``).
    ``trains``: a level means something only after training; the planner measures it only with recovery
    (``recover="finetune"`` or ``"distill"``) and says so otherwise.
    ``at_site(config, site name) -> str | None``: what the config does at one site (the plan report's per-layer
    table); None: nothing said per site.
    ``label``: the method's name in plots and tables (default: its registry name)."""

    levels: Callable[[Any, SweepContext], Levels]
    describe: Callable[[Any], str]
    order: int
    role: Role = "alone"
    calibrated: bool = False
    trains: bool = False
    at_site: Callable[[Any, str], str | None] | None = None
    label: str = ""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise HeadwiseError(f"sweep role {self.role!r}; use one of {', '.join(ROLES)}")
