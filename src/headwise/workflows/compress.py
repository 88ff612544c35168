"""Collaborative heads as one function (``headwise compress``): a trade-off curve of widths, the conversion at the
chosen width (on calibration inputs when given: the attention-score objective), evaluation before and after,
recovery.

>>> summary = compress_heads(model, tokenizer, get_task("stsb"), CollaborativeConfig(dk=192), curve=[64, 128])
"""

from __future__ import annotations

from typing import Any, Sequence

from torch import nn

from ..collaborative import CollaborativeConfig, compress, input_moments, tradeoff
from ..collaborative.compression import check_compressible
from ..contract import config_to_dict
from ..sites import select_sites
from ..tasks import Task
from .record import run_record, model_costs
from ..training.recovery import Recovery


def compress_heads(model: nn.Module, tokenizer: Any, task: Task | None, config: CollaborativeConfig, *,
                   calibration: Sequence[Any] | None = None, curve: Sequence[int | float] = (),
                   recovery: Recovery | None = None, evaluate: bool = True, model_name: str = "",
                   calibration_name: str | None = None) -> dict[str, Any]:
    """Convert ``model`` to collaborative heads in place by ``config``; returns the summary (what ``headwise
    compress`` writes to compression.json). ``calibration``: texts or model-input batches whose attention scores
    the fit minimises (None: the weights' own error); ``curve``: the widths of the trade-off curve (the relative
    error at each, measured before the conversion); ``recovery`` after it; ``evaluate`` before and after on
    ``task``. ``model_name``, ``calibration_name``: how the summary names them."""
    recovery = recovery or Recovery()
    sites = select_sites(model, config.kinds)
    check_compressible(model, sites, config.dk)
    moments = input_moments(model, sites, calibration, tokenizer, config.batch_size, config.max_length) \
        if calibration else None
    points = tradeoff(model, list(curve), config, moments=moments) if curve else []
    costs = model_costs(model)

    def metric() -> float | None:
        return round(float(task.evaluate(model, tokenizer)[task.metric]), 2) if evaluate else None

    metric_before = metric()
    teacher = recovery.teacher_for(model, tokenizer, task)
    result = compress(model, config=config, moments=moments)
    metric_edited = metric()
    recovered = recovery.run(model, tokenizer, task, teacher)
    metric_recovered = metric() if recovery.mode != "none" else None
    return {"model": model_name, "calibration": calibration_name, "config": config_to_dict(config)["config"],
            **result.as_dict(), "task": None if task is None else task.name,
            **run_record(task, metric_before, metric_edited, metric_recovered, costs, model), "recovery": recovered,
            "curve": [c.as_dict() for c in points]}
