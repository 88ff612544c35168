"""What an attention module can carry: a ``HeadOps`` container with four kinds of op.

- output ops ``[B, Tq, H, d] -> [B, Tq, H, d]`` (gates, mixers), applied after attention on every path;
- probability ops ``(probs[B, H, Tq, Tk], keep[B, 1|H, Tq, Tk] | None) -> probs`` (quantizers, masks);
- observers ``(probs, keep, out) -> None`` (statistics; never saved). ``probs[B, H, Tq, Tk]`` with
  ``keep[B|1, 1|H, Tq, Tk] | None``, or, for an observer whose ``takes_rows`` is True, a ``ProbRows``
  (``probs.py``: the same probabilities by query rows, their masks with them) and ``keep=None`` when nothing needs
  whole maps (no probability op, no returned attentions, every active observer takes rows): the module then runs
  SDPA. An observer whose ``active`` is False is skipped (a backward's recomputation; the path stays the one
  its forward took);
- a mechanism ``(module, q, k, v, keep, scaling, dropout, causal) -> out`` that replaces softmax attention.

Saved ops subclass ``HeadOp``: they know how to describe themselves (``spec``) so a checkpoint can rebuild them.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar

import torch
from torch import nn

from ..errors import HeadwiseError
from ..sites import AttentionSite, find_sites
from .dispatch import execution_device
from .probs import ProbRows

ATTR = "headwise"  # attribute name on the attention module; appears in state_dict keys
SLOTS = ("output", "prob", "mechanism")
OP_TYPES: dict[str, type["HeadOp"]] = {}

Observer = Callable[["torch.Tensor | ProbRows", "torch.Tensor | None", torch.Tensor], None]


class HeadOp(nn.Module):
    """Base of every op that is saved with the model. Subclasses set ``op_type`` and return their
    constructor arguments from ``spec()`` (JSON values only)."""

    op_type: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.op_type:
            OP_TYPES[cls.op_type] = cls

    def spec(self) -> dict[str, Any]:
        raise NotImplementedError


class HeadOps(nn.Module):
    """The ops attached to one attention module (see the module docstring for the four kinds)."""

    def __init__(self) -> None:
        super().__init__()
        self.output = nn.ModuleDict()
        self.prob = nn.ModuleDict()
        self.mechanism = nn.ModuleDict()  # at most one entry
        self.observers: dict[str, Observer] = {}

    def active_observers(self) -> list[Observer]:
        """The observers that want this call (``active``, True when an observer does not say)."""
        return [observe for observe in self.observers.values() if getattr(observe, "active", True)]

    @property
    def needs_probs(self) -> bool:
        """Whether this call reads probabilities: a probability op or an active observer."""
        return bool(len(self.prob) or self.active_observers())

    @property
    def needs_maps(self) -> bool:
        """Whether calls need whole maps (the explicit softmax): a probability op, or an observer that does not take
        rows — active or not, so that a backward's recomputation of a checkpointed block (observers inactive) runs
        the graph its forward ran."""
        return bool(len(self.prob)) or not all(getattr(o, "takes_rows", False) for o in self.observers.values())

    def is_empty(self) -> bool:
        return not (len(self.output) or len(self.prob) or len(self.mechanism) or self.observers)


def ops_of(target: AttentionSite | nn.Module, create: bool = False) -> HeadOps | None:
    """The ``HeadOps`` of a site or attention module (created empty on request)."""
    module = target.module if isinstance(target, AttentionSite) else target
    ops = getattr(module, ATTR, None)
    if ops is None and create:
        ops = HeadOps()
        device = execution_device(module)
        if device is not None:
            ops.to(device)
        setattr(module, ATTR, ops)
    return ops


def attach(site: AttentionSite, slot: str, name: str, op: nn.Module, replace: bool = False) -> nn.Module:
    """Attach ``op`` to ``site`` in ``slot`` (one of ``SLOTS``) under ``name``; returns the op."""
    if slot not in SLOTS:
        raise HeadwiseError(f"unknown op slot {slot!r}; use one of {', '.join(SLOTS)}")
    ops = ops_of(site, create=True)
    table = getattr(ops, slot)
    if name in table and not replace:
        raise HeadwiseError(f"{site.name} already has a {slot} op named {name!r}; detach it first or pass replace=True")
    if slot == "mechanism" and len(table) and name not in table:
        raise HeadwiseError(f"{site.name} already has a mechanism ({next(iter(table))}); a site runs one at a time")
    device = execution_device(site.module)  # never offloaded: see runtime.dispatch
    if device is not None and isinstance(op, nn.Module):
        op.to(device=device)
    if isinstance(op, nn.Module):
        op.train(site.module.training)  # follow the model's mode (stochastic ops sample only in training)
    table[name] = op
    return op


def detach(site: AttentionSite, name: str) -> None:
    """Remove every op called ``name`` from ``site`` (no error if absent). Drops the container when empty."""
    ops = ops_of(site)
    if ops is None:
        return
    for slot in SLOTS:
        table = getattr(ops, slot)
        if name in table:
            del table[name]
    ops.observers.pop(name, None)
    if ops.is_empty():
        delattr(site.module, ATTR)


def attached(model: nn.Module, slot: str, name: str) -> dict[str, nn.Module]:
    """The ops called ``name`` in ``slot`` across ``model``'s sites, keyed by site path."""
    found = {}
    for site in find_sites(model):
        ops = ops_of(site)
        if ops is not None and name in getattr(ops, slot):
            found[site.path] = getattr(ops, slot)[name]
    return found


def detach_all(model: nn.Module, name: str, missing_ok: bool = True) -> None:
    """Detach every op called ``name`` from every site of ``model`` (what each method's ``remove_*`` does).
    ``missing_ok=False`` raises when no site carries one (a ``remove_*`` that would silently do nothing)."""
    sites = find_sites(model)
    if not missing_ok and not any(_carries(site, name) for site in sites):
        raise HeadwiseError(f"{type(model).__name__} carries no op named {name!r}; nothing to remove "
                            "(missing_ok=True to allow)")
    for site in sites:
        detach(site, name)


def _carries(site: AttentionSite, name: str) -> bool:
    ops = ops_of(site)
    return ops is not None and (any(name in getattr(ops, slot) for slot in SLOTS) or name in ops.observers)


def add_observer(site: AttentionSite, name: str, observer: Observer) -> None:
    ops_of(site, create=True).observers[name] = observer


def saved_specs(site: AttentionSite) -> list[dict[str, Any]]:
    """The saved ops of ``site`` as JSON records (observers are not saved)."""
    ops = ops_of(site)
    if ops is None:
        return []
    records = []
    for slot in SLOTS:
        for name, op in getattr(ops, slot).items():
            if not isinstance(op, HeadOp):
                raise HeadwiseError(
                    f"op {name!r} on {site.name} is a {type(op).__name__}, not a headwise.runtime.HeadOp: "
                    "it cannot be saved. Subclass HeadOp (set op_type, implement spec()) or detach it before saving."
                )
            records.append({"site": site.path, "slot": slot, "name": name, "type": op.op_type, "spec": op.spec()})
    return records


def rebuild(site: AttentionSite, record: dict[str, Any]) -> None:
    """Attach the op a record describes (weights come later, from the state dict)."""
    cls = OP_TYPES.get(record["type"])
    if cls is None:
        raise HeadwiseError(
            f"checkpoint uses op type {record['type']!r}, unknown to this headwise version "
            f"(known: {', '.join(sorted(OP_TYPES))}). Upgrade headwise or import the module that defines it."
        )
    attach(site, record["slot"], record["name"], cls(**record["spec"]))
