"""Performing a planned edit as one function (``headwise apply plan.json``): the plan's point applied exactly as it
was measured, recovery, evaluation before and after.

>>> summary = apply_plan(model, tokenizer, Plan.load("plan/plan.json"), recovery=Recovery(mode="distill"))
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..contract import measured
from ..planning import Plan
from ..planning.axes import savings
from ..tasks import Task
from .record import model_costs, run_record
from ..training.recovery import Recovery


def apply_plan(model: nn.Module, tokenizer: Any, plan: Plan, point: str | None = None, *,
               recovery: Recovery | None = None, task: Task | None = None, evaluate: bool = True,
               plan_path: str = "plan.json") -> dict[str, Any]:
    """Perform ``point`` of ``plan`` (default: the recommended one) on ``model`` in place, then recover by
    ``recovery`` (default: what the plan measured with) and evaluate before and after (``evaluate``); returns
    the summary (what ``headwise apply`` writes to apply.json). ``task``: the plan's, unless given."""
    chosen = plan.point(point)
    recovery = recovery or Recovery(mode=plan.settings.get("recover", "none"))
    task = task or plan.make_task()
    # a reversible edit distils from the model with its ops off; others from the unedited model's outputs (lm)
    # or a copy
    teacher = recovery.teacher_for(model, tokenizer, task, reversible=chosen.edit.reversible)

    def metric() -> float | None:  # through the methods the model carries, as the plan measured (a KV policy)
        if not evaluate:
            return None
        with measured(model):
            return float(task.evaluate(model, tokenizer, progress=False)[task.metric])

    before, costs = metric(), model_costs(model)
    plan.execute(model, tokenizer, chosen.name, task, progress=None)
    edited = metric()
    if recovery.mode != "none":
        recovery.run(model, tokenizer, task, teacher)
    after = metric() if recovery.mode != "none" else edited
    return {"plan": plan_path, "point": chosen.name, "edit": chosen.edit.records(),
            "describe": chosen.edit.describe(), "recover": recovery.mode,
            **run_record(task, before, edited, after if recovery.mode != "none" else None, costs, model),
            "planned": chosen.measured["score"], "saves": savings(chosen.to_dict(), plan.base.to_dict())}
