"""Metrics that are defined on the data or refused: correlations need two pairs and two distinct values on each
side, and no metric leaves a task as NaN or infinity."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import torch

from ..errors import HeadwiseError


def check_gold(gold: Sequence[float] | np.ndarray, what: str) -> None:
    """Refuse gold scores ``[N]`` on which a correlation is undefined: fewer than two, or all equal."""
    gold = np.asarray(gold, dtype=np.float64)
    if len(gold) < 2:
        raise HeadwiseError(f"{what}: a correlation needs at least two pairs, got {len(gold)}; evaluate more "
                            "(raise --limit)")
    if np.all(gold == gold[0]):
        raise HeadwiseError(f"{what}: every gold score is {gold[0]:g}, so a correlation is undefined; evaluate on "
                            "pairs with different scores (raise --limit or use another split)")


def correlations(pred: Sequence[float] | np.ndarray, gold: Sequence[float] | np.ndarray, what: str) -> dict[str, float]:
    """``{"pearson", "spearman"}`` ×100 of ``pred`` against ``gold`` (both ``[N]``); refuses, naming ``what``
    (the data), fewer than two pairs, a constant gold column or constant predictions (both undefined)."""
    from scipy.stats import pearsonr, spearmanr

    pred, gold = np.asarray(pred, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    check_gold(gold, what)
    if not np.isfinite(pred).all():
        raise HeadwiseError(f"{what}: the model's predictions hold NaN or infinity; check the model for non-finite "
                            "weights or gates")
    if np.all(pred == pred[0]):
        raise HeadwiseError(f"{what}: the model predicts the same value ({pred[0]:g}) for every pair, so a "
                            "correlation is undefined; check the model (a collapsed or damaged checkpoint)")
    return {"pearson": 100 * float(pearsonr(pred, gold).statistic),
            "spearman": 100 * float(spearmanr(pred, gold).statistic)}


def finite_metrics(metrics: dict[str, Any], what: str) -> dict[str, Any]:
    """``metrics`` unchanged when every number in it is finite; else refused with the first bad one."""
    for key, value in metrics.items():
        if isinstance(value, (float, np.floating)) and not math.isfinite(value):
            raise HeadwiseError(f"{what}: the metric {key} came out {value} (not a finite number); the model "
                                "produced non-finite outputs: check it for NaN/inf weights or gates")
    return metrics


def finite_outputs(values: torch.Tensor, what: str) -> None:
    """Refuse model outputs (logits or embeddings, any shape) holding NaN or infinity: a metric computed from them
    (an argmax, a generation) would be a number on garbage."""
    if not torch.isfinite(values).all():
        raise HeadwiseError(f"{what}: the model's outputs hold NaN or infinity; check it for non-finite weights or "
                            "gates")
