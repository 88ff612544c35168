"""One combined edit, as data: registered method configs (``headwise.contract``), applied in the ``order`` their
declarations give (``Planned.order``); the function that performs it; and ``edited``, which performs it in place
for a block and restores the model exactly afterwards (``snapshot.AttentionSnapshot``: no model copy). A plan.json
stores an edit as its method records (``{"method", "version", "config"}``, ``contract.config_to_dict``), replayed
through ``headwise.apply``.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch
from torch import nn

from ..allocator import trim
from ..contract import apply, config_from_dict, config_to_dict, method_of
from ..runtime.dispatch import refuse_offloaded
from ..errors import HeadwiseError
from ..sites import find_sites
from .snapshot import AttentionSnapshot

LAST = 1_000  # where a method that is not planned goes in a combined edit: after every planned one


def _order(config: Any) -> int:
    planned = method_of(config).planned
    return LAST if planned is None else planned.order


def _calibrated(config: Any) -> bool:
    planned = method_of(config).planned
    return planned is not None and planned.calibrated


def __getattr__(name: str) -> Any:
    if name == "EditedModel":  # its name before it was split out (one release)
        warnings.warn("headwise.planning.edits.EditedModel is now headwise.planning.snapshot.AttentionSnapshot",
                      FutureWarning, stacklevel=2)
        return AttentionSnapshot
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
            method = method_of(c)
            parts.append(method.describe(c) if method.describe else method.name)
        return " + ".join(parts) or "no edit"

    def needs_calibration(self) -> bool:
        return any(_calibrated(c) for c in self.configs)

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
    ``calibration``: model-input batches for the calibrated methods (``Planned.calibrated``: the KV merge and the
    collaborative objective); an edit that uses one is refused without them (the plan measured the calibrated
    forms)."""
    if not edit.reversible and edit.configs:
        refuse_offloaded(find_sites(model), f"edit '{edit.describe()}'")
    if edit.needs_calibration() and not calibration:
        raise HeadwiseError(f"edit '{edit.describe()}' has calibrated methods (their fits read calibration data): "
                            "pass calibration batches (Plan.execute builds them from the tokenizer)")
    for config in edit.configs:
        inputs = {"calibration": calibration, "progress": progress} if _calibrated(config) else {}
        apply(model, config, **inputs)
    return model


@contextmanager
def edited(model: nn.Module, edit: Edit, calibration: Sequence[dict[str, torch.Tensor]] | None = None,
           progress: bool | None = False) -> Iterator[AttentionSnapshot]:
    """Perform ``edit`` on ``model`` in place for the block and restore it exactly afterwards (every tensor,
    module, config value and model attribute as before; also after an error). No tensor is copied: the attention
    modules are set aside and stand-ins sharing their tensors take their place (``snapshot.AttentionSnapshot``);
    the edit builds the new tensors it needs, and a method that would write into one of the model's tensors is
    refused before it does (``AttentionSnapshot.read_only``). So the extra memory is what the edited modules hold
    beyond the originals (e.g. the merged projections of a KV merge), never a copy of the model; and the originals
    that nothing but the set-aside modules holds any more (the projections a removal or a merge replaced) wait on
    disk until ``state.original()`` or the restore reads them back (``AttentionSnapshot``). The heap pages
    freed by the edit's work (once it is built) and by the edit itself (once restored) go back to the system
    (``allocator.trim``), so each step's peak is its own."""
    state = AttentionSnapshot(model)
    state._install(state.copies)
    try:
        with state.read_only(f"edit '{edit.describe()}'"):
            for config in edit.configs:
                apply_edit(model, Edit((config,)), calibration, progress)
                state.offload_unused()  # the originals it replaced, until state.original() or restore()
        trim()  # the fits' freed work, before the block measures the edited model
        yield state
    finally:
        state.restore()  # drops the stand-ins and the tensors the edit built
        trim()
