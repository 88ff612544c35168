"""Head pruning as one function (``headwise prune``): choose heads by L0 gates trained with the task, by gradient
importance or by a fixed mask, remove them physically, evaluate before and after, recover.

>>> run = prune(model, tokenizer, get_task("stsb"), PruneSettings(strategy="importance", keep=54))
>>> run.summary["heads_after"], run.summary["metric_edited"]
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ..errors import HeadwiseError
from ..pruning import apply_masks, load_masks, prune_masked
from ..pruning.config import L0Training
from ..pruning.declaration import STRATEGIES, UNITS
from ..sites import find_sites
from ..tasks import Task
from ..training.recipes import importance_prune, l0_prune, l0_training, removable
from .record import model_costs, run_record
from ..training.recovery import Recovery


@dataclass
class PruneSettings:
    """How ``prune`` chooses heads. ``strategy``: ``l0`` (Hard-Concrete gates trained with the task toward
    ``keep`` open heads for ``epochs`` / ``max_steps``; ``training``: ``L0Training`` fields set by hand, the rest
    from ``training.recipes.l0_training``), ``importance`` (gradient importance on ``importance_examples`` training
    examples, masking ``unit``\\s: query heads or whole key/value groups; ``iterative`` recomputes it after each
    ``step`` heads) or ``mask`` (``masks``: a mask spec, or the path of a JSON/YAML file of one,
    ``pruning.load_masks``; ``load_masks()`` reads it). ``allow_empty_layers``: a layer
    may lose every head."""

    strategy: str = "l0"
    keep: int | None = None
    unit: str = "query"
    masks: dict[str, Any] | str | None = None
    iterative: bool = False
    step: int | None = None
    epochs: float = 1.0
    max_steps: int = -1
    importance_examples: int = 256
    allow_empty_layers: bool = False
    training: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise HeadwiseError(f"unknown pruning strategy {self.strategy!r}; use one of {', '.join(STRATEGIES)}")
        if self.unit not in UNITS:
            raise HeadwiseError(f"unknown unit {self.unit!r}; use one of {', '.join(UNITS)}")
        if self.strategy == "mask":
            if not self.masks:
                raise HeadwiseError("--strategy mask needs --mask FILE (JSON/YAML: site or kind -> 0/1 per head)")
        elif self.keep is None or self.keep < 1:
            raise HeadwiseError(f"--strategy {self.strategy} needs --keep N with N ≥ 1 (the number of heads to keep)")
        if self.epochs <= 0:
            raise HeadwiseError(f"--epochs {self.epochs:g} must be > 0")
        if self.unit != "query" and self.strategy != "importance":
            raise HeadwiseError(f"--unit {self.unit} applies to --strategy importance; l0 and mask choose query heads")
        unknown = sorted(set(self.training) - {f.name for f in dataclasses.fields(L0Training)})
        if unknown:
            raise HeadwiseError(f"training {unknown}: not fields of L0Training")

    def load_masks(self) -> None:
        """Read ``masks`` when it is a file's path (a bad file fails here, before any model work)."""
        if isinstance(self.masks, str):
            self.masks = load_masks(self.masks)


@dataclass
class PruneRun:
    """What ``prune`` did: ``summary`` (what ``headwise prune`` writes to pruning.json: heads before and after,
    removed heads per site, the metric before, after the edit and after recovery, the importance curve, the L0
    outcome) and ``masked_only`` (heads were masked, not removed: partial key/value groups stay)."""

    summary: dict[str, Any]
    masked_only: bool


def check_plain(model: nn.Module, settings: PruneSettings) -> None:
    """Refuse up front a plain-transformers export of the pruned model that cannot be: query-head pruning of a
    grouped-query model (partial key/value groups). Other head counts are written natively or zero-padded
    (``io.plain``)."""
    if settings.strategy != "mask" and max(s.group_size for s in find_sites(model)) > 1 \
            and (settings.strategy == "l0" or settings.unit == "query"):
        raise HeadwiseError(f"--plain: {settings.strategy} pruning of single query heads leaves key/value groups with "
                            "only some of their query heads, which plain transformers cannot hold; use --strategy "
                            "importance --unit kv-group (nothing was written)")


def l0_warning(outcome: dict[str, Any], settings: PruneSettings) -> str | None:
    """The line that says L0 training did not reach its target (more gates open than ``keep``, so the cut to
    ``keep`` was made by gate ranking), naming the options that would help; None when it did."""
    extra = outcome["open_heads"] - outcome["target_heads"]
    if extra <= 0:
        return None
    trained = f"--max-steps {settings.max_steps}" if settings.max_steps > 0 else f"--epochs {settings.epochs:g}"
    return (f"L0 did not reach its target: {outcome['open_heads']} gates open after {trained} (target --keep "
            f"{outcome['target_heads']}); the other {extra} heads were cut by gate ranking, not by training. Train "
            f"longer (a larger --epochs or --max-steps: the penalty grows with the steps) or use --strategy "
            "importance (one pass, no training)")


def prune(model: nn.Module, tokenizer: Any, task: Task | None, settings: PruneSettings,
          recovery: Recovery | None = None, *, evaluate: bool = True, model_name: str = "") -> PruneRun:
    """Prune ``model`` in place by ``settings`` (see ``PruneSettings``) on ``task`` (None only for a mask without
    evaluation or recovery), evaluating before and after (``evaluate``) and recovering (``recovery``); returns
    the ``PruneRun`` (``model_name``: how the summary names the model)."""
    recovery = recovery or Recovery()
    if task is None and (settings.strategy != "mask" or evaluate or recovery.mode != "none"):
        raise HeadwiseError(f"pruning by {settings.strategy} with evaluation or recovery needs a task")
    sites = find_sites(model)
    before = model_costs(model)
    if settings.keep is not None and settings.keep > before["heads"]:
        raise HeadwiseError(f"--keep {settings.keep} is more than the model's {before['heads']} heads")

    def metric(m: nn.Module) -> float:
        return round(float(task.evaluate(m, tokenizer)[task.metric]), 2)  # progress: a bar, or lines in a log

    metric_before = metric(model) if evaluate else None
    teacher = recovery.teacher_for(model, tokenizer, task)
    curve, masked_only, l0 = [], False, None
    if settings.strategy == "mask":
        settings.load_masks()
        apply_masks(model, settings.masks)
        removed = prune_masked(model, settings.allow_empty_layers)
    elif settings.strategy == "importance":
        steps = importance_prune(model, tokenizer, settings.keep, task, iterative=settings.iterative,
                                 step=settings.step, examples=settings.importance_examples, unit=settings.unit,
                                 metric=metric if evaluate else None)
        masked_only = not removable(model, steps.steps[-1].masks)
        curve = [[s.kept, s.metric] for s in steps.steps]
        by_path = {s.path: s.name for s in sites}
        removed = {by_path[p]: [h for h, m in enumerate(mask) if not m] for p, mask in steps.steps[-1].masks.items()}
    else:
        l0 = {}
        training = dataclasses.replace(l0_training(tokenizer, settings.keep, task, settings.epochs,
                                                   max_steps=settings.max_steps), **settings.training)
        removed = l0_prune(model, tokenizer, settings.keep, task, training=training, epochs=settings.epochs,
                           max_steps=settings.max_steps, outcome=l0)
        l0["training"] = dataclasses.asdict(training)
        l0["warning"] = l0_warning(l0, settings)
        masked_only = sum(s.num_heads for s in find_sites(model)) == before["heads"] and any(removed.values())
    metric_edited = metric(model) if evaluate else None
    recovered = recovery.run(model, tokenizer, task, teacher)
    metric_recovered = metric(model) if evaluate and recovery.mode != "none" else None
    summary = {
        "method": settings.strategy + (" (iterative)" if settings.iterative else ""), "model": model_name,
        "task": None if task is None else task.name, "unit": settings.unit,
        "heads_before": before["heads"], "heads_after": before["heads"] - sum(map(len, removed.values())),
        "kv_heads_after": sum(s.num_kv_heads for s in find_sites(model)), "masked_only": masked_only,
        "removed": {s.name: removed.get(s.name, []) for s in sites},
        "survivors": {s.name: [0 if h in removed.get(s.name, []) else 1 for h in range(s.num_heads)] for s in sites},
        **run_record(task, metric_before, metric_edited, metric_recovered, before, model), "recovery": recovered,
        "curve": curve, "l0": l0,
    }
    return PruneRun(summary, masked_only)
