"""The summary fields every editing workflow writes, with one meaning each (``run_record``), and the costs they
compare (``model_costs``)."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..sites import find_sites


def model_costs(model: nn.Module) -> dict[str, int]:
    """What an edit changes that a user pays for: parameters, attention heads and key/value heads."""
    sites = find_sites(model)
    return {"parameters": sum(p.numel() for p in model.parameters()), "heads": sum(s.num_heads for s in sites),
            "kv_heads": sum(s.num_kv_heads for s in sites)}


def metric_label(task: Any) -> str | None:
    """How reports name the task's main metric: ``STS-B <split> Spearman ×100`` for STS-B (the split evaluated),
    else ``<task> <metric>``."""
    if task is None:
        return None
    return f"STS-B {task.split} Spearman ×100" if task.name == "stsb" else f"{task.name} {task.metric}"


def run_record(task: Any, before: float | None, edited: float | None, recovered: float | None,
               costs_before: dict[str, int], model: nn.Module) -> dict[str, Any]:
    """``metric_before`` (the unedited model), ``metric_edited`` (right after the edit), ``metric_recovered``
    (after recovery; None without), ``costs`` (``model_costs`` before and after). None where not measured."""
    return {"metric_name": metric_label(task), "metric_before": before, "metric_edited": edited,
            "metric_recovered": recovered, "costs": {"before": costs_before, "after": model_costs(model)}}
