"""A snapshot of what an edit may rewrite: every attention site's outermost module and the model's config (nested
sub-configs included), set aside while copies stand in the model, so that an edit applied in place changes only
the copies and the model is restored exactly afterwards (``edits.edited``). Only the attention modules are copied:
with their tensors when the edit rewrites weights, sharing them when it only attaches ops; Accelerate's offloaded
weights are always shared."""

from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from torch import nn

from ..sites import find_sites


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


class AttentionSnapshot:
    """The attention modules an edit may rewrite (every site's module and projections) and the model's config,
    set aside untouched while copies of those modules stand in the model: an edit applied in place then changes
    only the copies (``edited``). ``original()`` swaps the originals back in for a block (the base of a
    side-by-side latency, or a teacher); ``restore()`` puts them back for good. (Formerly ``EditedModel``.)"""

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
