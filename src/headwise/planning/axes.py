"""The cost axes of a plan, written once: what each measured cost is called in a point's ``measured`` mapping, in a
budget (``Budget``), in plots and in tables. Every axis is a ratio to the unedited model, except ``heads`` (a
count). Budget parsing, the cost model, the Pareto front, the prediction of combined edits and the report read
this table."""

from __future__ import annotations

from dataclasses import dataclass


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


def by_budget(name: str) -> Axis:
    """The axis a budget names (``"kv_cache"``)."""
    return next(a for a in (HEADS, *COSTS) if a.budget == name)
