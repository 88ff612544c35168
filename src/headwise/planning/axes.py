"""The cost axes of a plan, written once: what each measured cost is called in a point's ``measured`` mapping, in a
budget (``Budget``), in plots and in tables. Every axis is a ratio to the unedited model, except ``heads`` (a
count). Budget parsing, the cost model, the Pareto front, the prediction of combined edits and the report read
this table; ``cost_ratio`` and ``savings`` read a measured point against the unedited one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Axis:
    """``key``: the measured cost (``Costs`` field); ``budget``: its name in a budget (``kv-cache=-50%``: written
    with ``-`` on the command line); ``label``: its name in plots; ``short``: a table column; ``saving``: how the
    verdict names a change on it."""

    key: str
    budget: str
    label: str
    short: str
    saving: str


HEADS = Axis("heads", "heads", "query heads", "heads", "heads")
COSTS: tuple[Axis, ...] = (  # ratios to the unedited model, in the order plots and tables show them
    Axis("latency", "latency", "latency (× unedited, measured)", "latency ×", "latency"),
    Axis("attention_params", "params", "attention parameters", "params ×", "attention params"),
    Axis("flops", "flops", "attention FLOPs per sequence", "FLOPs ×", "attention FLOPs"),
    Axis("kv_bytes", "kv_cache", "KV-cache bytes per token", "KV ×", "KV cache"),
)
BUDGET_AXES: tuple[str, ...] = (HEADS.budget, *(a.budget for a in COSTS))  # what a budget may limit
COST_KEYS: tuple[str, ...] = tuple(a.key for a in COSTS)  # the Pareto front's cost objectives


def cost_ratio(costs: dict[str, float | None], base: dict[str, float | None], key: str) -> float | None:
    """A measured cost as a ratio to the unedited model's (``latency`` is measured as one already); None when
    either is unknown (not measured, not counted) or the base is 0."""
    if key == "latency":
        return costs.get("latency")
    value, reference = costs.get(key), base.get(key)
    return None if value is None or not reference else value / reference


def savings(point: dict[str, Any], base: dict[str, Any]) -> str:
    """``heads 72 → 36, attention params −50%, latency 0.74×`` for the axes the edit changed (an axis not counted
    says so); ``point`` and ``base``: points of a plan.json (``Point.to_dict``)."""
    out = []
    m, b = point["measured"], base["measured"]
    if m["heads"] != b["heads"]:
        out.append(f"heads {b['heads']} → {m['heads']}")
    for axis in COSTS:
        if axis.key == "latency":
            continue
        ratio = cost_ratio(m, b, axis.key)
        if m.get(axis.key) is None:
            out.append(f"{axis.saving} not counted")
        elif ratio is not None and abs(ratio - 1) > 1e-3:
            out.append(f"{axis.saving} {100 * (ratio - 1):+.0f}%")
    if m.get("latency") is not None:
        out.append(f"latency {m['latency']:.2f}× (measured)")
    return ", ".join(out)
