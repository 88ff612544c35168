"""Budgets a user thinks in: ``heads=36,latency=0.75x,params=-20%,kv-cache=-50%,flops=-30%``.

``heads`` is a count (``36``) or a share of the model's heads (``0.5``, ``50%``; ``100%`` is every head). Every
other axis is a ratio to the unedited model (``0.75x``, ``75%``, ``-25%`` and ``0.75`` all mean "at most three
quarters"; ``+20%`` means 1.2x, which only ``latency`` may exceed 1 by); ``params`` counts attention parameters (q/k/v/o and what replaces them), ``flops`` the
attention FLOPs at the task's sequence length, ``kv-cache`` the key/value cache bytes per token (decoders),
``latency`` the measured forward time on this machine at the task's batch shape.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, fields
from typing import Any

from torch import nn

from ..errors import HeadwiseError
from ..sites import find_sites
from .axes import COSTS, cost_ratio

RATIO = re.compile(r"^(?P<sign>[-+]?)(?P<num>\d+(\.\d*)?|\.\d+)(?P<unit>x|%)?$")
EXAMPLE = "heads=36,latency=0.75x,params=-20%,kv-cache=-50%,flops=-30%"


@dataclass(frozen=True)
class Budget:
    """Upper limits: ``heads`` (an int: a count; a float: a share in (0, 1] of the model's heads), the rest ratios
    in (0, 1] of the unedited model (``latency`` may exceed 1). ``None``: no limit on that axis."""

    heads: float | None = None
    latency: float | None = None
    params: float | None = None
    kv_cache: float | None = None
    flops: float | None = None

    @classmethod
    def parse(cls, text: "str | Budget | dict[str, Any]") -> "Budget":
        """``"heads=36,latency=0.75x"`` (also a dict of the same, or a Budget) → Budget; a bad entry raises."""
        if isinstance(text, Budget):
            return text
        items = text.items() if isinstance(text, dict) else _pairs(str(text))
        values: dict[str, float] = {}
        for key, raw in items:
            axis = str(key).strip().replace("-", "_")
            if axis not in AXES:
                raise HeadwiseError(f"budget {key!r}: unknown axis; use {', '.join(a.replace('_', '-') for a in AXES)}"
                                    f" (e.g. {EXAMPLE})")
            if axis in values:
                raise HeadwiseError(f"budget {key!r} is given twice; give each axis once")
            values[axis] = _heads(raw) if axis == "heads" else _ratio(axis, raw)
        if not values:
            raise HeadwiseError(f"the budget is empty; give at least one limit, e.g. {EXAMPLE}")
        return cls(**values)

    def to_dict(self) -> dict[str, float]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def __str__(self) -> str:
        parts = []
        for f in fields(self):
            v = getattr(self, f.name)
            if v is not None:
                parts.append(f"{f.name.replace('_', '-')}={_show(f.name, v)}")
        return ",".join(parts)

    def head_count(self, total: int) -> int | None:
        """The heads limit as a count of ``total`` heads."""
        if self.heads is None:
            return None
        return int(round(self.heads * total)) if isinstance(self.heads, float) else int(self.heads)

    def validate(self, model: nn.Module, allow_empty_layers: bool = False) -> None:
        """Raise ``HeadwiseError`` if ``model`` cannot meet this budget at all (before any work is done)."""
        sites = find_sites(model)
        total = sum(s.num_heads for s in sites)
        heads = self.head_count(total)
        if heads is not None:
            floor = 1 if allow_empty_layers else len(sites)
            if heads > total:
                raise HeadwiseError(f"budget heads={_show('heads', self.heads)}: the model has only {total} heads")
            if heads < floor:
                raise HeadwiseError(
                    f"budget heads={_show('heads', self.heads)} is fewer than the {len(sites)} attention layers "
                    f"(each keeps at least one head); raise it to ≥ {len(sites)} or pass --allow-empty-layers"
                    if not allow_empty_layers else f"budget heads={heads}: keep at least one head")
        if self.kv_cache is not None and not any(s.causal and s.kind != "dec-enc" for s in sites):
            raise HeadwiseError(f"budget kv-cache={_show('kv_cache', self.kv_cache)}: {type(model).__name__} has no "
                                "decoder self-attention, so it keeps no key/value cache; drop the kv-cache limit")

    def met_by(self, costs: dict[str, float | None], base: dict[str, float | None]) -> bool:
        """Whether measured ``costs`` (see ``planning.costs``) fit, relative to the unedited ``base``."""
        return not self.violations(costs, base)

    def violations(self, costs: dict[str, float | None], base: dict[str, float | None]) -> list[str]:
        """The axes on which ``costs`` exceed this budget (an unmeasured axis counts as exceeded)."""
        return [axis for axis, share in self.shares(costs, base).items() if share > 1 + 1e-9]

    def load(self, costs: dict[str, float | None], base: dict[str, float | None]) -> float:
        """The largest share of a limit that ``costs`` use (≤ 1 fits; 0 with no limits): how far a point is
        from the budget, to rank points that miss it."""
        return max(self.shares(costs, base).values(), default=0.0)

    def shares(self, costs: dict[str, float | None], base: dict[str, float | None]) -> dict[str, float]:
        """``{limited axis: cost / limit}`` (an axis not measured or not counted counts as infinitely over)."""
        out = {}
        heads = self.head_count(int(base["heads"]))
        if heads is not None:
            out["heads"] = costs["heads"] / heads if heads else math.inf
        for axis in COSTS:
            limit = getattr(self, axis.budget)
            if limit is not None:
                ratio = cost_ratio(costs, base, axis.key)
                out[axis.budget] = math.inf if ratio is None else ratio / limit
        return out


AXES: tuple[str, ...] = tuple(f.name for f in fields(Budget))  # planning.axes' budget names, in the fields' order


def _pairs(text: str) -> list[tuple[str, str]]:
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise HeadwiseError(f"budget entry {part!r}: write axis=value, e.g. {EXAMPLE}")
        out.append((key, value.strip()))
    return out


def _heads(raw: Any) -> int | float:
    """A head count (int) or a share of the heads (float in (0, 1]): ``36``; ``0.5``, ``50%``, ``100%``; a float
    ≤ 1 given as a number (a dict from ``to_dict``) is a share."""
    text = str(raw).strip()
    share = text.endswith("%") or (isinstance(raw, float) and raw <= 1)
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise HeadwiseError(f"budget heads={text!r}: give a head count (36) or a share (0.5, 50%)") from None
    if not math.isfinite(value) or value <= 0:
        raise HeadwiseError(f"budget heads={text!r}: give a positive head count (36) or a share (0.5, 50%)")
    if share or value < 1:
        if value > 1:
            raise HeadwiseError(f"budget heads={text!r} is more than every head; give a share up to 100%")
        return float(value)
    if value != int(value):
        raise HeadwiseError(f"budget heads={text!r}: give a whole head count (36) or a share below 1 (0.5)")
    return int(value)


def _ratio(axis: str, raw: Any) -> float:
    text = str(raw).strip().replace(" ", "")
    m = RATIO.match(text)
    if not m:
        raise HeadwiseError(f"budget {axis.replace('_', '-')}={text!r}: give a ratio such as 0.75x, 75% or -25%")
    num = float(m["num"])
    if m["sign"]:
        if m["unit"] != "%":
            raise HeadwiseError(f"budget {axis.replace('_', '-')}={text!r}: a change is a percentage (-25%, +10%)")
        value = 1 + (num if m["sign"] == "+" else -num) / 100
        if value > 1 and axis != "latency":
            raise HeadwiseError(f"budget {axis.replace('_', '-')}={text!r} would allow growth; a limit on "
                                f"{axis.replace('_', '-')} is a cut, e.g. -{m['num']}%")
    else:
        value = num / 100 if m["unit"] == "%" else num
    upper = 10.0 if axis == "latency" else 1.0
    if not 0 < value <= upper:
        raise HeadwiseError(f"budget {axis.replace('_', '-')}={text!r} means {value:g}× the unedited model; it must "
                            f"lie in (0, {upper:g}]")
    return value


def _show(axis: str, value: float) -> str:
    if axis == "heads":
        return f"{value * 100:g}%" if isinstance(value, float) else str(value)
    return f"{value:g}x"
