"""Deprecated names of what a method declares for ``headwise.plan`` (one release): ``Sweep`` bundled the planner's
settings with the ``levels`` / ``describe`` / ``at_site`` functions; a method now declares ``planned=Planned(...)``
(``headwise.declaration``) and gives those functions as hooks (``headwise.contract.MethodHooks``).
``SweepContext`` is ``headwise.declaration.PlanContext``; ``Levels``, ``Role`` and ``ROLES`` live there too.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable

from .declaration import ROLES, Levels, PlanContext, Planned, Role

SweepContext = PlanContext
__all__ = ["Sweep", "SweepContext", "Levels", "Role", "ROLES"]


@dataclass(frozen=True)
class Sweep:
    """Deprecated: ``register_method(..., sweep=Sweep(levels, describe, order=..., ...))`` still plans the method,
    with a ``FutureWarning`` (``Planned`` and the hooks now)."""

    levels: Callable[[Any, PlanContext], Levels]
    describe: Callable[[Any], str]
    order: int
    role: Role = "alone"
    calibrated: bool = False
    trains: bool = False
    at_site: Callable[[Any, str], str | None] | None = None
    label: str = ""

    def __post_init__(self) -> None:
        self.planned()  # a bad role raises here, as it did

    def planned(self) -> Planned:
        """The ``Planned`` these settings declare (a role of "heads" ranks by gradient, the built-in ranking)."""
        return Planned(order=self.order, role=self.role, calibrated=self.calibrated, trains=self.trains,
                       label=self.label, rankings=("gradient",) if self.role == "heads" else ())

    def hooks(self) -> dict[str, Callable[..., Any]]:
        """Its functions as hooks."""
        return {k: v for k, v in (("levels", self.levels), ("describe", self.describe), ("at_site", self.at_site))
                if v is not None}

    @classmethod
    def _of(cls, planned: Planned, hooks: Any) -> "Sweep":
        """The old view of a declared method (``Method.sweep``)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return cls(hooks.levels, hooks.describe, planned.order, planned.role, planned.calibrated, planned.trains,
                       hooks.at_site, planned.label)
