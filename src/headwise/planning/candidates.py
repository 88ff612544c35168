"""The single-method candidates of a plan: every registered method with a ``Sweep`` (``headwise.sweep``) gives
its levels on the model, each one edit of the whole model; a method the model cannot take is skipped with its
reason."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from ..contract import METHODS, Method
from ..errors import HeadwiseError
from ..sweep import SweepContext
from .edits import Edit


@dataclass
class Candidate:
    name: str  # e.g. "prune-36", "dk-0.25"
    method: Method
    edit: Edit
    proxy: float | None = None  # relative output error on the calibration batches


@dataclass
class Candidates:
    """What the sweeps gave: the candidates in method order, why a method gave none, and the per-site proxies
    (``{label: {site name: value}}``)."""

    singles: list[Candidate] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    site_proxies: dict[str, dict[str, float]] = field(default_factory=dict)


def plannable(methods: "tuple[str, ...] | list[str] | None" = None) -> list[Method]:
    """The registered methods with a sweep, in their order (``methods``: only these; a name that is not
    registered, or has no sweep, raises listing the plannable ones)."""
    found = sorted((m for m in METHODS.values() if m.sweep is not None), key=lambda m: m.sweep.order)
    if methods is None:
        return found
    names = [m.name for m in found]
    bad = [n for n in methods if n not in names]
    if bad or not methods:
        raise HeadwiseError(f"methods {list(methods)}: plan can try {', '.join(names)} (registered methods with a "
                            "sweep)")
    return [m for m in found if m.name in methods]


def candidates(model: nn.Module, context: SweepContext, methods: list[Method], recover: str) -> Candidates:
    """Ask each method's sweep for its levels on ``model``; a method that ``trains`` is skipped without
    recovery (``recover="none"``)."""
    out = Candidates()
    for method in methods:
        if method.sweep.trains and recover == "none":
            out.skipped[method.name] = "its levels need training: plan with recover='finetune' or 'distill'"
            continue
        levels = method.sweep.levels(model, context)
        if levels.why_none:
            out.skipped[method.name] = levels.why_none
        if levels.site_proxy:
            out.site_proxies[levels.proxy_label or method.name] = dict(levels.site_proxy)
        taken = {c.name for c in out.singles}
        clash = [name for name, _ in levels.configs if name in taken or name == "base"]
        if clash:
            raise HeadwiseError(f"the {method.name} sweep names a level {clash[0]!r}, a name already taken in this "
                                "plan; point names must be unique")
        out.singles += [Candidate(name, method, Edit((config,))) for name, config in levels.configs]
    return out
