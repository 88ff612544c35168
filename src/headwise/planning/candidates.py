"""The single-method candidates of a plan: every registered method whose declaration is ``planned`` gives its levels
on the model (its ``levels`` hook), each one edit of the whole model; a method the model cannot take is skipped
with its reason."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from torch import nn

from ..contract import METHODS, Method, method_named
from ..declaration import PlanContext
from ..errors import HeadwiseError
from .edits import Edit


@dataclass
class Candidate:
    name: str  # e.g. "prune-36", "dk-0.25"
    method: Method
    edit: Edit
    proxy: float | None = None  # relative output error on the calibration batches


@dataclass
class Candidates:
    """What the methods gave: the candidates in method order, why a method gave none, and the per-site proxies
    (``{label: {site name: value}}``)."""

    singles: list[Candidate] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    site_proxies: dict[str, dict[str, float]] = field(default_factory=dict)


def plannable(methods: Sequence[str] | None = None) -> list[Method]:
    """The registered planned methods, in their order (``methods``: only these, by name or former name, which
    warns; a name that is not registered, or not planned, raises listing the plannable ones)."""
    found = sorted((m for m in METHODS.values() if m.planned is not None), key=lambda m: m.planned.order)
    if methods is None:
        return found
    names = ", ".join(m.name for m in found)
    chosen = []
    for text in methods:
        try:
            method = method_named(text, planned=True)
        except HeadwiseError:
            method = None
        if method not in found:
            raise HeadwiseError(f"methods {list(methods)}: {text!r} is not planned; plan can try {names} (registered "
                                "methods whose declaration is planned)")
        chosen.append(method)
    if not chosen:
        raise HeadwiseError(f"methods is empty; plan can try {names}")
    return [m for m in found if m in chosen]


def candidates(model: nn.Module, context: PlanContext, methods: list[Method], recover: str) -> Candidates:
    """Ask each method for its levels on ``model``; a method whose levels train is skipped without recovery
    (``recover="none"``)."""
    out = Candidates()
    for method in methods:
        if method.planned.trains and recover == "none":
            out.skipped[method.name] = "its levels need training: plan with recover='finetune' or 'distill'"
            continue
        levels = method.levels(model, context)
        if levels.why_none:
            out.skipped[method.name] = levels.why_none
        if levels.site_proxy:
            out.site_proxies[levels.proxy_label or method.name] = dict(levels.site_proxy)
        taken = {c.name for c in out.singles}
        clash = [name for name, _ in levels.configs if name in taken or name == "base"]
        if clash:
            raise HeadwiseError(f"the {method.name} levels name a point {clash[0]!r}, a name already taken in this "
                                "plan; point names must be unique")
        out.singles += [Candidate(name, method, Edit((config,))) for name, config in levels.configs]
    return out
