"""One combined edit, as data: registered method configs (``headwise.contract``), applied in their sweeps'
``order`` (heads removed → KV heads merged → collaborative heads → mechanism → quantization for the built-in
methods); the function that performs it; and ``edited``, which performs it in place for a block and restores the
model exactly afterwards (no model copy). A plan.json stores an edit as its method records
(``{"method", "version", "config"}``, ``contract.config_to_dict``), replayed through ``headwise.apply``.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch
from torch import nn

from ..contract import apply, config_from_dict, config_to_dict, method_of
from ..errors import HeadwiseError
from ..sites import find_sites

LAST = 1_000  # where a method without a sweep goes in a combined edit: after every planned one


def _order(config: Any) -> int:
    sweep = method_of(config).sweep
    return LAST if sweep is None else sweep.order


@dataclass(frozen=True)
class Edit:
    """Method configs applied together, in their sweeps' order (one config per method); ``Edit()`` does nothing."""

    configs: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        configs = tuple(sorted(self.configs, key=_order))  # a stable sort: equal orders keep the given order
        names = [method_of(c).name for c in configs]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise HeadwiseError(f"an edit takes one config per method; {', '.join(twice)} given twice")
        object.__setattr__(self, "configs", configs)

    @property
    def methods(self) -> tuple[str, ...]:
        """The registered names of its methods, in application order."""
        return tuple(method_of(c).name for c in self.configs)

    @property
    def weights_only(self) -> bool:
        """Whether every method rewrites weights (nothing attached: plain transformers can hold the result)."""
        return not any(method_of(c).reversible for c in self.configs)

    @property
    def reversible(self) -> bool:
        """Whether it edits something and only attaches ops (every method removable: no tensor is rewritten)."""
        return bool(self.configs) and all(method_of(c).reversible for c in self.configs)

    def config(self, method: str) -> Any:
        """The config of ``method`` in this edit, or None."""
        return next((c for c in self.configs if method_of(c).name == method), None)

    def then(self, other: "Edit") -> "Edit":
        """This edit and ``other``'s methods together."""
        return Edit(self.configs + other.configs)

    def describe(self) -> str:
        """``remove 36 heads + collaborative heads dk=50% of the heads' width``."""
        parts = []
        for c in self.configs:
            sweep = method_of(c).sweep
            parts.append(sweep.describe(c) if sweep else method_of(c).name)
        return " + ".join(parts) or "no edit"

    def needs_calibration(self) -> bool:
        return any(method_of(c).sweep and method_of(c).sweep.calibrated for c in self.configs)

    def records(self) -> list[dict[str, Any]]:
        """The method records of a plan.json, in application order."""
        return [config_to_dict(c) for c in self.configs]

    @classmethod
    def from_records(cls, records: Any) -> "Edit":
        """The edit of a plan.json's records; a record that is not a valid method record is refused with one
        line naming it."""
        if not isinstance(records, list):
            raise HeadwiseError(f"edit is a {type(records).__name__}, not a list of method records "
                                "({\"method\", \"version\", \"config\"})")
        configs = []
        for i, record in enumerate(records):
            try:
                configs.append(config_from_dict(record))
            except HeadwiseError as err:
                raise HeadwiseError(f"edit record {i}: {err}") from None
        return cls(tuple(configs))


def apply_edit(model: nn.Module, edit: Edit, calibration: Sequence[dict[str, torch.Tensor]] | None = None,
               progress: bool | None = False) -> nn.Module:
    """Perform ``edit`` on ``model`` in place, each config through ``headwise.apply``; returns the model.
    ``calibration``: model-input batches for the calibrated methods (``Sweep.calibrated``: the KV merge and the
    collaborative objective); an edit that uses one is refused without them (the plan measured the calibrated
    forms)."""
    offloaded = [s.name for s in find_sites(model) if not edit.reversible and edit.configs
                 and any(p.device.type == "meta" for p in s.module.parameters())]
    if offloaded:
        raise HeadwiseError(f"edit '{edit.describe()}' rewrites attention weights that are offloaded (on the meta "
                            f"device, e.g. {offloaded[0]}): load the model with a --max-memory that keeps the "
                            "attention weights on a device, or without --device-map")
    if edit.needs_calibration() and not calibration:
        raise HeadwiseError(f"edit '{edit.describe()}' has calibrated methods (their fits read calibration data): "
                            "pass calibration batches (Plan.apply builds them from the tokenizer)")
    for config in edit.configs:
        sweep = method_of(config).sweep
        inputs = {"calibration": calibration, "progress": progress} if sweep and sweep.calibrated else {}
        apply(model, config, **inputs)
    return model


def _configs(config: Any) -> list[Any]:
    """``config`` and every config nested in it (encoder/decoder/text sub-configs), each once."""
    found, stack = {}, [config]
    while stack:
        c = stack.pop()
        if id(c) in found or not hasattr(c, "to_dict"):
            continue
        found[id(c)] = c
        stack += [v for v in vars(c).values() if hasattr(v, "to_dict") and hasattr(v, "model_type")]
    return list(found.values())


def _touched_slots(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """``(parent, child name, module)`` for the outermost modules holding some site's projections: the only
    places an edit rewrites (projections replaced, attributes set, ops attached, the class swapped)."""
    modules = {}
    for s in find_sites(model):
        for m in (s.module, s.q.module, s.k.module, s.v.module, s.o.module):
            modules.setdefault(id(m), m)
    inner = {id(sub) for m in modules.values() for sub in m.modules() if sub is not m}
    outer = {i for i in modules if i not in inner}
    return [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
            if id(child) in outer]


def _shared_hook_state(module: nn.Module) -> dict[int, Any]:
    """Accelerate's offloaded weights (``_hf_hook.weights_map``), which a copy of ``module`` must share, not copy."""
    memo = {}
    for sub in module.modules():
        hook = getattr(sub, "_hf_hook", None)
        for h in getattr(hook, "hooks", [hook]):
            for attr in ("weights_map", "tied_params_map"):
                value = getattr(h, attr, None)
                if value is not None:
                    memo[id(value)] = value
    return memo


class EditedModel:
    """``model`` with an edit applied in place on copies of the touched modules only (``edited``); the original
    modules and config stay aside, untouched, and ``original()`` swaps them back in for a block (the base of a
    side-by-side latency, or a teacher)."""

    def __init__(self, model: nn.Module, share_tensors: bool) -> None:
        self.model = model
        self.slots = _touched_slots(model)
        self.configs = _configs(model.config)
        keep = {id(c): c for c in self.configs}  # the copies refer to the model's own config objects
        self.saved = [copy.deepcopy(vars(c), memo=dict(keep)) for c in self.configs]
        self.attn = model.config._attn_implementation
        self.copies = []
        for parent, name, module in self.slots:
            memo = dict(keep) | _shared_hook_state(module)
            if share_tensors:  # reversible edits rewrite no tensor: the copy shares them
                memo |= {id(t): t for t in [*module.parameters(), *module.buffers()]}
            self.copies.append(copy.deepcopy(module, memo))

    def _install(self, modules: Sequence[nn.Module]) -> None:
        for (parent, name, _), module in zip(self.slots, modules):
            setattr(parent, name, module)

    def _set_configs(self, states: Sequence[dict[str, Any]]) -> None:
        for c, state in zip(self.configs, states):
            vars(c).clear()
            vars(c).update(state)

    def _swap_in_originals(self) -> tuple[list[nn.Module], list[dict[str, Any]]]:
        now = [getattr(parent, name) for parent, name, _ in self.slots], [dict(vars(c)) for c in self.configs]
        self._install([m for _, _, m in self.slots])
        self._set_configs([copy.copy(s) for s in self.saved])
        return now

    @contextmanager
    def original(self) -> Iterator[nn.Module]:
        """The unedited model for the block (same object; the edited modules are put back after)."""
        modules, states = self._swap_in_originals()
        try:
            yield self.model
        finally:
            self._install(modules)
            self._set_configs(states)

    def restore(self) -> None:
        """Put the original modules and config back for good (the edited copies are dropped)."""
        if self.model.config._attn_implementation != self.attn:
            self.model.set_attn_implementation(self.attn)
        self._swap_in_originals()
        self.copies = []


@contextmanager
def edited(model: nn.Module, edit: Edit, calibration: Sequence[dict[str, torch.Tensor]] | None = None,
           progress: bool | None = False) -> Iterator[EditedModel]:
    """Perform ``edit`` on ``model`` in place for the block and restore it exactly afterwards (every tensor,
    module and config value as before; also after an error). Only the attention modules are copied — with their
    tensors when the edit rewrites weights (removal, KV merge, collaborative heads), sharing them when every
    method only attaches ops (``Edit.reversible``: mechanism, quantization) — so the extra memory is at most one copy of the attention
    weights, never a copy of the model."""
    state = EditedModel(model, share_tensors=edit.reversible or not edit.configs)
    state._install(state.copies)
    try:
        apply_edit(model, edit, calibration, progress)
        yield state
    finally:
        state.restore()
