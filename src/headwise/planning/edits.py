"""One combined edit, as data: which heads go, how many key/value heads stay, the collaborative width, an
efficient mechanism on some layers, attention-probability quantization; and the function that performs it.

The order is fixed: remove heads → merge key/value heads (``convert_gqa``) → collaborative heads
(``compress``) → mechanism → quantization. Everything that needs data uses the calibration batches given.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

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
        unknown = set(data) - set(METHODS)
        if unknown:
            raise HeadwiseError(f"edit has unknown fields {sorted(unknown)}; known: {', '.join(METHODS)}")
        return cls(**{k: v for k, v in data.items()})

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
