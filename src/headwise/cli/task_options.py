"""``--task`` and the task options every verb shares, and the task they describe."""

from __future__ import annotations

import argparse
from typing import Any

from .options import TASK_NAMES, add

# the task options: flag → the task field it sets (help and type: options.SHARED)
OPTIONS: dict[str, str] = {
    "--data": "data", "--split": "split", "--max-length": "max_length", "--stride": "stride",
    "--max-tokens": "max_tokens", "--data-dir": "data_dir", "--src": "src", "--tgt": "tgt", "--src-file": "src_file",
    "--tgt-file": "tgt_file", "--beam": "beam", "--max-new-tokens": "max_new_tokens", "--text-column": "text_column",
    "--pair-column": "pair_column", "--label-column": "label_column", "--limit": "limit", "--batch-size": "batch_size",
    "--lengths": "lengths", "--samples": "samples", "--haystack": "haystack",
}


# which tasks read each option (the tasks' dataclass fields; a test keeps the two in step)
USED_BY: dict[str, tuple[str, ...]] = {
    "data": ("stsb", "lm", "classification", "long"), "split": ("stsb", "lm", "translation", "classification"), "max_length": ("lm", "translation", "classification"),
    "stride": ("lm",), "max_tokens": ("lm",), "data_dir": ("translation",), "src": ("translation",),
    "tgt": ("translation",), "src_file": ("translation",), "tgt_file": ("translation",), "beam": ("translation",),
    "max_new_tokens": ("translation",), "text_column": ("classification",), "pair_column": ("classification",),
    "label_column": ("classification",), "limit": ("stsb", "translation", "classification"),
    "batch_size": ("stsb", "translation", "classification"), "lengths": ("long",), "samples": ("long",),
    "haystack": ("long",),
}


def task_args(parser: argparse.ArgumentParser, task: str | None = None, default: str = "stsb",
              shown: str | None = None) -> None:
    """The task group: ``--task`` (``default``) and every task option the verb lacks; with ``task`` (``eval
    <task>``, where the task is the sub-command) only that task's options."""
    g = parser.add_argument_group("task and data")
    if task is None:
        add(g, "--task", default=default, shown=shown)
    for flag, option in OPTIONS.items():
        if flag not in parser._option_string_actions and (task is None or task in USED_BY[option]):
            add(g, flag, default=None)
    if task in (None, "classification"):
        add(g, "--new-head")


def task_from_args(args: argparse.Namespace, name: str | None = None, skip: tuple[str, ...] = (), check: bool = True):
    """The task named by ``--task`` (or ``name``) with the options given on the command line (``skip``: options
    the verb uses for itself, e.g. analyze's ``--limit``); its data is checked before any model loads (unless not
    ``check``: a verb that reads no data, e.g. kv-policy without a text)."""
    from ..tasks import get_task

    name = name or args.task
    options = {option: getattr(args, flag[2:].replace("-", "_"), None) for flag, option in OPTIONS.items()
               if option not in skip}
    if name == "stsb" and options.get("split") is None:
        options["split"] = "dev"
    task = get_task(name, **{k: v for k, v in options.items() if v is not None and _takes(name, k)})
    if check:
        task.check()
    return task


def _takes(name: str, option: str) -> bool:
    from dataclasses import fields

    from ..tasks import TASKS

    return option in {f.name for f in fields(TASKS[name])}


def load_for_task(args: argparse.Namespace, task) -> tuple[Any, Any]:
    """The model of ``--model`` with the head ``task`` needs, checked against the task (``--max-length``
    included)."""
    from ..models import load_model

    num_labels, names = None, None
    if getattr(args, "new_head", False) and task.name == "classification":  # a fresh head keeps the class names
        num_labels, names = (1, None) if task.is_regression() else (None, task.label_names())
    model, tokenizer = load_model(args.model, args.device, args.dtype, task=task, **dispatch_of(args),
                                  new_head=getattr(args, "new_head", False), num_labels=num_labels, label_names=names)
    task.check_model(model, tokenizer)
    check_max_length(args, model, tokenizer)
    return model, tokenizer


def dispatch_of(args: argparse.Namespace) -> dict[str, Any]:
    """``--device-map`` / ``--max-memory`` / ``--offload-folder`` / ``--verify`` as ``load_model`` keywords."""
    return {"device_map": getattr(args, "device_map", None), "max_memory": getattr(args, "max_memory", None),
            "offload_folder": getattr(args, "offload_folder", None), "verify": getattr(args, "verify", None)}


def load_task_model(args: argparse.Namespace, task, need_tokenizer: bool = False) -> tuple[Any, Any]:
    """The model for a verb: the base encoder for STS-B (as before tasks existed), else the head of the task —
    ``task``, or when the verb needs no task object (``--no-eval``) the one ``--task`` names, so that what the
    verb saves is the task's model and reloads as such; checked against the task. Without a task (and unless
    ``need_tokenizer``) a model saved without tokenizer is taken as it is: the tokenizer is None."""
    if task is not None and task.name != "stsb":
        return load_for_task(args, task)
    from ..models import load_model, optional_tokenizer

    name = getattr(args, "task", None) if task is None else None
    optional = task is None and not need_tokenizer
    model, tokenizer = load_model(args.model, args.device, args.dtype, with_tokenizer=not optional,
                                  task=name if name in TASK_NAMES and name != "stsb" else None, **dispatch_of(args))
    if optional:
        tokenizer = optional_tokenizer(args.model, model)
    if task is not None:
        task.check_model(model, tokenizer)
    check_max_length(args, model, tokenizer)
    return model, tokenizer


def check_max_length(args: argparse.Namespace, model, tokenizer) -> None:
    """Refuse a ``--max-length`` beyond the model's positions (one line naming the limit) instead of the index
    error the embeddings would raise mid-run."""
    from ..batching import check_context

    if getattr(args, "max_length", None) is not None:
        check_context(model, tokenizer, args.max_length)


def task_metric(task, model, tokenizer) -> float:
    """The task's main metric, rounded to 2 decimals (what edit commands report before and after)."""
    return round(float(task.evaluate(model, tokenizer, progress=False)[task.metric]), 2)


def metric_line(task, metrics: dict[str, float]) -> str:
    """``perplexity 19.93 (nll 2.99, tokens 24,576)``: the main metric first, then the rest."""
    def fmt(value: Any) -> str:
        return f"{value:,}" if isinstance(value, int) else f"{value:.2f}" if isinstance(value, float) else str(value)

    rest = ", ".join(f"{k} {fmt(v)}" for k, v in metrics.items() if k != task.metric)
    return f"{task.metric} {fmt(metrics[task.metric])}" + (f" ({rest})" if rest else "")


def model_costs(model) -> dict[str, int]:
    """``workflows.record.model_costs`` (parameters, heads, key/value heads)."""
    from ..workflows.record import model_costs

    return model_costs(model)


def run_record(task, before: float | None, edited: float | None, recovered: float | None,
               costs_before: dict[str, int], model) -> dict:
    """``workflows.record.run_record``: the summary fields every editing verb writes."""
    from ..workflows.record import run_record

    return run_record(task, before, edited, recovered, costs_before, model)


def metric_label(task) -> str | None:
    """``workflows.record.metric_label``: how reports name the task's main metric."""
    from ..workflows.record import metric_label

    return metric_label(task)
