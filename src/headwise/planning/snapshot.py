"""A snapshot of what an edit may rewrite, kept without copying a tensor: every attention site's outermost module
and the model's config (nested sub-configs included) are set aside while stand-ins take their place, so that an
edit applied in place changes only the stand-ins and the model is restored exactly afterwards (``edits.edited``).

A stand-in is a copy of the module's Python objects whose parameters are new ``Parameter`` objects over the same
storage (its buffers and Accelerate's offloaded weights are the same objects): it costs no tensor memory. An edit
may therefore replace a stand-in's projections, attributes, class or ops, rebind its parameters and build new
tensors, but never write into a tensor it did not create: ``read_only`` refuses such a write before it happens,
naming the op and the tensor, so a method that would corrupt the model is stopped with the model intact. The
model's own attributes (e.g. ``generate``'s cache hook that a KV policy or a latent cache wraps on the instance)
are restored too."""

from __future__ import annotations

import copy
import warnings
import weakref
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Sequence

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ..allocator import trim
from ..errors import HeadwiseError, HeadwiseNote
from ..sites import find_sites
from ..io.spill import Spill, storage_key


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


def _stand_in_tensors(module: nn.Module) -> dict[int, Any]:
    """The deep-copy memo that gives a copy of ``module`` its tensors without copying them: each plain parameter
    becomes a new ``Parameter`` over the same storage (rebinding it, ``.data =`` or ``requires_grad_``, leaves the
    original alone); buffers and parameters of other types are the same objects."""
    memo: dict[int, Any] = {}
    for p in module.parameters():
        memo[id(p)] = nn.Parameter(p.detach(), requires_grad=p.requires_grad) if type(p) is nn.Parameter else p
    memo |= {id(b): b for b in module.buffers()}
    return memo


def _storage(t: torch.Tensor) -> int:
    """The identity of ``t``'s storage (``spill.storage_key``; 0: none to protect, on ``meta``)."""
    return 0 if t.device.type == "meta" else storage_key(t.untyped_storage())


def _tensors(modules: Iterable[nn.Module]) -> dict[int, torch.Tensor]:
    """``{id: tensor}`` of the modules' parameters and buffers that have a storage (each tensor once)."""
    return {id(t): t for m in modules for t in [*m.parameters(), *m.buffers()] if _storage(t)}


_use_count = getattr(torch._C, "_storage_Use_Count", None)  # how many tensors (and storage objects) hold a storage


def _held_outside(model: nn.Module, slots: Iterable[nn.Module]) -> set[int]:
    """``id``s of the tensors that modules of ``model`` other than the ``slots`` (and theirs) register themselves:
    a tensor tied into one of them is the model's whatever the slots hold."""
    inside = {id(m) for slot in slots for m in slot.modules()}
    return {id(t) for m in model.modules() if id(m) not in inside
            for t in [*m._parameters.values(), *m._buffers.values()] if t is not None}


def _spill_alone(tensors: Iterable[torch.Tensor], spill: Spill, keys: set[int], dying: int = 0) -> int:
    """Spill each storage of ``keys`` over which no tensor lies but some of ``tensors`` (its use count: any other
    tensor over it, a view, an op's reference or a parameter of the model, counts too) and ``dying`` tensors being
    dropped (a weakref callback runs before the tensor lets go of its storage); returns the bytes freed."""
    over: dict[int, list[torch.Tensor]] = {}
    for t in tensors:
        if _storage(t) in keys:
            over.setdefault(_storage(t), []).append(t)
    freed = 0
    for key, ts in over.items():
        storage = ts[0].untyped_storage()
        if key not in spill and _use_count(key) == len(ts) + dying + 1:  # + `storage`
            freed += spill.add(storage)
    return freed


class _ReadOnly(TorchDispatchMode):
    """Refuses, before it runs, any op that writes into one of ``storages`` (``{address: tensor name}``)."""

    def __init__(self, storages: dict[int, str], what: str) -> None:
        super().__init__()
        self.storages, self.what = storages, what

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for i, arg in enumerate(func._schema.arguments):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            for t in value if isinstance(value, (list, tuple)) else [value]:
                name = self.storages.get(_storage(t)) if isinstance(t, torch.Tensor) else None
                if name is not None:
                    raise HeadwiseError(
                        f"{self.what} wrote into the model's {name} in place ({func.__name__}); a planned method builds "
                        "new tensors instead (the plan measures edits without copying the model; docs/adding.md)")
        return func(*args, **kwargs)


class AttentionSnapshot:
    """The attention modules an edit may rewrite (every site's module and projections), the model's config and its
    own attributes, set aside untouched while stand-ins of those modules (sharing their tensors) take their place:
    an edit applied in place then changes only the stand-ins (``edited``). ``original()`` swaps the originals back
    in for a block (the base of a side-by-side latency, or a teacher); ``restore()`` puts them back for good.
    (Formerly ``EditedModel``.)"""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.slots = _touched_slots(model)
        self.configs = _configs(model.config)
        keep = {id(c): c for c in self.configs}  # the copies refer to the model's own config objects
        self.saved = [copy.deepcopy(vars(c), memo=dict(keep)) for c in self.configs]
        self.attn = model.config._attn_implementation
        self.attributes = dict(vars(model))  # the model's own attributes (a hook an edit wraps on the instance)
        paths = {id(m): path for path, m in model.named_modules()}
        self.paths = [paths[id(module)] for _, _, module in self.slots]
        memos = [_stand_in_tensors(module) for _, _, module in self.slots]
        self.copies = [copy.deepcopy(module, dict(keep) | _shared_hook_state(module) | memo)
                       for (_, _, module), memo in zip(self.slots, memos)]
        self._spill_when_unused(memos)

    def _spill_when_unused(self, memos: Sequence[dict[int, Any]]) -> None:
        """Watch the storages the stand-ins only borrow (each plain parameter's, given a stand-in ``Parameter``):
        once no tensor but the set-aside originals lies over one, it waits on disk (``spill.Spill``) until
        ``original()`` or ``restore()`` reads it back. Checked when a stand-in parameter is dropped (a method
        replacing one site's projections frees their memory there and then) and by ``offload_unused``."""
        self.spill = Spill()
        self.releasing = _use_count is not None  # False inside original() and after restore() too
        if not self.releasing:
            warnings.warn("this torch cannot count a storage's users (torch._C._storage_Use_Count): the plan keeps "
                          "the originals an edit replaced in memory while it is measured", HeadwiseNote, stacklevel=3)
        self.originals = _tensors(module for _, _, module in self.slots)
        pairs = [(t, memo[id(t)]) for memo, (_, _, module) in zip(memos, self.slots)
                 for t in _tensors([module]).values()]
        outside = _held_outside(self.model, [module for _, _, module in self.slots])
        shared = {_storage(t) for t, stand_in in pairs if stand_in is t or id(t) in outside}  # the model's own
        self.borrowed = {_storage(t) for t, stand_in in pairs if stand_in is not t} - shared
        self.watched = [weakref.finalize(stand_in, self._release, _storage(t)) for t, stand_in in pairs
                        if _storage(t) in self.borrowed]
        for watch in self.watched:
            watch.atexit = False

    def _release(self, key: int) -> int:
        """A stand-in over the storage ``key`` is being dropped: spill the storage if only the originals lie over
        it besides; returns the bytes freed."""
        if not self.releasing:
            return 0
        return _spill_alone(self.originals.values(), self.spill, {key}, dying=1)

    def offload_unused(self) -> int:
        """Spill every watched storage that only the originals lie over now (``_spill_when_unused``); returns the
        bytes freed. ``edits.edited`` calls it after each method of an edit."""
        return _spill_alone(self.originals.values(), self.spill, self.borrowed) if self.releasing else 0

    def _install(self, modules: Sequence[nn.Module]) -> None:
        for (parent, name, _), module in zip(self.slots, modules):
            setattr(parent, name, module)

    def _set_configs(self, states: Sequence[dict[str, Any]]) -> None:
        for c, state in zip(self.configs, states):
            vars(c).clear()
            vars(c).update(state)

    def _swap_in_originals(self) -> tuple[list[nn.Module], list[dict[str, Any]]]:
        if len(self.spill):
            trim()  # the heap pages the edited model's measurement freed, before the originals come back
            self.spill.reload()
        now = [getattr(parent, name) for parent, name, _ in self.slots], [dict(vars(c)) for c in self.configs]
        self._install([m for _, _, m in self.slots])
        self._set_configs([copy.copy(s) for s in self.saved])
        return now

    @contextmanager
    def read_only(self, what: str = "the edit") -> Iterator[None]:
        """Inside the block, an op writing into a tensor of the set-aside modules (shared with the stand-ins)
        raises ``HeadwiseError`` naming ``what``, the op and the tensor, before anything is written."""
        storages = {}
        for path, (_, _, module) in zip(self.paths, self.slots):
            for key, t in [*module.named_parameters(), *module.named_buffers()]:
                if _storage(t):
                    storages.setdefault(_storage(t), f"{path}.{key}")
        with _ReadOnly(storages, what):
            yield

    @contextmanager
    def original(self) -> Iterator[nn.Module]:
        """The unedited model for the block (same object; the edited modules are put back after). The two swap
        places on disk: inside the block the tensors only the edited modules hold wait there, after it the
        originals that only the set-aside modules hold, so both never take memory at once."""
        releasing, self.releasing = self.releasing, False
        edited = Spill()
        if releasing:
            now = [getattr(parent, name) for parent, name, _ in self.slots]
            outside = _held_outside(self.model, now)
            ours = [t for t in _tensors(now).values() if id(t) not in self.originals and id(t) not in outside]
            _spill_alone(ours, edited, {_storage(t) for t in ours})
        modules, states = self._swap_in_originals()
        try:
            yield self.model
        finally:
            trim()  # what the unedited model's forwards freed
            edited.reload()
            self._install(modules)
            self._set_configs(states)
            self.releasing = releasing
            self.offload_unused()  # the originals back on disk

    def restore(self) -> None:
        """Put the original modules, config and attributes back for good (the stand-ins are dropped)."""
        for watch in self.watched:
            watch.detach()
        self.watched, self.releasing = [], False
        if self.model.config._attn_implementation != self.attn:
            self.model.set_attn_implementation(self.attn)
        self._swap_in_originals()
        now = vars(self.model)
        for key in [k for k in now if k not in self.attributes]:
            del now[key]
        for key, value in self.attributes.items():
            if now.get(key) is not value:
                now[key] = value
        self.copies = []
