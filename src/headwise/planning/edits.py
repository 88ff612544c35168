"""One combined edit, as data: which heads go, how many key/value heads stay, the collaborative width, an
efficient mechanism on some layers, attention-probability quantization; the function that performs it; and
``edited``, which performs it in place for a block and restores the model exactly afterwards (no model copy).

The order is fixed: remove heads → merge key/value heads (``convert_gqa``) → collaborative heads
(``compress``) → mechanism → quantization. Everything that needs data uses the calibration batches given.
"""

from __future__ import annotations

import copy
import math
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Sequence

import torch
from torch import nn

from ..collaborative import compress
from ..conversion import convert_gqa
from ..errors import HeadwiseError
from ..mechanisms import apply as replace_attention
from ..pruning import prune_heads
from ..quantization import quantize_attention
from ..sites import find_sites

METHODS = ("prune", "kv_heads", "dk", "mechanism", "quantization")
LABELS = {"prune": "remove heads", "kv_heads": "merge KV heads", "dk": "collaborative heads",
          "mechanism": "efficient mechanism", "quantization": "quantized attention"}


@dataclass
class Edit:
    """``prune``: ``{site name: [removed query heads]}``; ``kv_heads``: key/value heads per decoder layer after
    ``convert_gqa``; ``dk``: collaborative query/key width (a count, or a share ``0 < dk < 1`` of each site's
    heads × head_dim left after pruning); ``mechanism``: ``{"name", "args", "sites"}``;
    ``quantization``: ``QuantizationConfig`` fields. Empty / ``None`` fields do nothing."""

    prune: dict[str, list[int]] = field(default_factory=dict)
    kv_heads: int | None = None
    dk: int | float | None = None
    mechanism: dict[str, Any] | None = None
    quantization: dict[str, Any] | None = None

    @property
    def methods(self) -> tuple[str, ...]:
        """The methods this edit uses, in application order."""
        return tuple(m for m in METHODS if getattr(self, m) and (m != "prune" or any(self.prune.values())))

    @property
    def removed(self) -> int:
        return sum(len(h) for h in self.prune.values())

    def describe(self) -> str:
        """``remove 36 heads + collaborative heads dk=192``."""
        parts = []
        if self.removed:
            parts.append(f"remove {self.removed} heads")
        if self.kv_heads:
            parts.append(f"{self.kv_heads} KV heads per layer")
        if self.dk:
            parts.append(f"collaborative heads dk={100 * self.dk:g}% of the heads' width" if isinstance(self.dk, float)
                         else f"collaborative heads dk={self.dk}")
        if self.mechanism:
            args = ",".join(f"{k}={v}" for k, v in self.mechanism.get("args", {}).items())
            parts.append(f"{self.mechanism['name']}({args}) on {len(self.mechanism['sites'])} layers")
        if self.quantization:
            q = self.quantization
            parts.append(f"attention {q.get('method')} {q.get('bits')}b" if q.get("method", "none") != "none"
                         else f"attention threshold {q.get('threshold')}")
        return " + ".join(parts) or "no edit"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Edit":
        """The edit a plan.json records; refuses fields of the wrong type (a head list ``"abc"``, a width
        ``"x"``) with one line naming the field."""
        if not isinstance(data, dict):
            raise HeadwiseError(f"edit is a {type(data).__name__}, not a mapping of {', '.join(METHODS)}")
        unknown = set(data) - set(METHODS)
        if unknown:
            raise HeadwiseError(f"edit has unknown fields {sorted(map(str, unknown))}; known: {', '.join(METHODS)}")
        prune = data.get("prune") or {}
        if not isinstance(prune, dict) or not all(
                isinstance(heads, list) and all(isinstance(h, int) and not isinstance(h, bool) and h >= 0
                                                for h in heads) for heads in prune.values()):
            raise HeadwiseError(f"edit prune {prune!r} must map site names to lists of head indices (integers ≥ 0)")
        kv_heads, dk = data.get("kv_heads"), data.get("dk")
        if kv_heads is not None and (not isinstance(kv_heads, int) or isinstance(kv_heads, bool) or kv_heads < 1):
            raise HeadwiseError(f"edit kv_heads {kv_heads!r} must be a positive integer or null")
        if dk is not None and (not isinstance(dk, (int, float)) or isinstance(dk, bool) or not 0 < dk < math.inf):
            raise HeadwiseError(f"edit dk {dk!r} must be a positive width, a share 0 < dk < 1, or null")
        mechanism = data.get("mechanism")
        if mechanism is not None and not (isinstance(mechanism, dict) and isinstance(mechanism.get("name"), str)
                                          and isinstance(mechanism.get("args"), dict)
                                          and isinstance(mechanism.get("sites"), list)):
            raise HeadwiseError(f"edit mechanism {mechanism!r} must be {{\"name\": str, \"args\": {{...}}, "
                                "\"sites\": [...]}} or null")
        if data.get("quantization") is not None and not isinstance(data["quantization"], dict):
            raise HeadwiseError(f"edit quantization {data['quantization']!r} must be a mapping of its options or null")
        return cls(**{k: v for k, v in data.items() if v is not None or k != "prune"})

    def needs_calibration(self) -> bool:
        return bool(self.kv_heads or self.dk)

    def per_site(self, model: nn.Module) -> dict[str, dict[str, Any]]:
        """``{site name: the choices that touch it}`` on the unedited ``model``."""
        out = {}
        for s in find_sites(model):
            mech = self.mechanism if self.mechanism and s.name in self.mechanism["sites"] else None
            out[s.name] = {"heads": s.num_heads, "removed": sorted(self.prune.get(s.name, [])),
                           "kv_heads": self.kv_heads if self.kv_heads and s.causal else None, "dk": self.dk,
                           "mechanism": None if mech is None else {"name": mech["name"], "args": mech["args"]},
                           "quantization": self.quantization}
        return out


def apply_edit(model: nn.Module, edit: Edit, calibration: Sequence[dict[str, torch.Tensor]] | None = None,
               allow_empty_layers: bool = False, progress: bool | None = False) -> nn.Module:
    """Perform ``edit`` on ``model`` in place (see the module docstring for the order); returns the model.
    ``calibration``: model-input batches for the calibrated KV merge and the collaborative objective; an edit
    that uses either is refused without them (the plan measured the calibrated forms)."""
    offloaded = [s.name for s in find_sites(model) if set(edit.methods) - set(REVERSIBLE)
                 and any(p.device.type == "meta" for p in s.module.parameters())]
    if offloaded:
        raise HeadwiseError(f"edit '{edit.describe()}' rewrites attention weights that are offloaded (on the meta "
                            f"device, e.g. {offloaded[0]}): load the model with a --max-memory that keeps the "
                            "attention weights on a device, or without --device-map")
    if edit.needs_calibration() and not calibration:
        raise HeadwiseError(f"edit '{edit.describe()}' merges KV heads or compresses to collaborative heads, which "
                            "are calibrated: pass calibration batches (Plan.apply builds them from the tokenizer)")
    if edit.prune and any(edit.prune.values()):
        prune_heads(model, {k: v for k, v in edit.prune.items() if v}, allow_empty_layers=allow_empty_layers)
    if edit.kv_heads:
        convert_gqa(model, kv_heads=edit.kv_heads, init="calibrated", calibration=calibration, progress=progress)
    if edit.dk:
        compress(model, dk=edit.dk, calibration=calibration, progress=progress)
    if edit.mechanism:
        replace_attention(model, edit.mechanism["name"], sites=edit.mechanism["sites"], **edit.mechanism["args"])
    if edit.quantization:
        quantize_attention(model, **edit.quantization)
    return model


REVERSIBLE = ("mechanism", "quantization")  # methods that only attach ops: nothing of the model's is rewritten


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
           allow_empty_layers: bool = False, progress: bool | None = False) -> Iterator[EditedModel]:
    """Perform ``edit`` on ``model`` in place for the block and restore it exactly afterwards (every tensor,
    module and config value as before; also after an error). Only the attention modules are copied — with their
    tensors when the edit rewrites weights (removal, KV merge, collaborative heads), sharing them when it only
    attaches ops (mechanism, quantization) — so the extra memory is at most one copy of the attention
    weights, never a copy of the model."""
    state = EditedModel(model, share_tensors=set(edit.methods) <= set(REVERSIBLE))
    state._install(state.copies)
    try:
        apply_edit(model, edit, calibration, allow_empty_layers, progress)
        yield state
    finally:
        state.restore()
