"""The task interface every verb uses: data, metrics, a training loss and calibration inputs.

A task knows which model head it needs (``head``), reads and checks its data before any model is loaded
(``check``), evaluates a model into a dict of metrics (``evaluate``), gives tokenised examples of a split
(``examples``: ``"train"``, ``"eval"`` or ``"calibration"``), what one forward pass yields on a collated batch
(``outputs``: logits or embeddings, read by the loss and by distillation), a per-example loss ``[B]`` from them
(``loss_from``; ``loss`` runs both, used by fine-tuning, L0, mixing, recovery and gradient importance) and model
inputs for calibration (``calibration_inputs``). Batching goes through ``headwise.batching`` for every task.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import torch
from torch import nn

from ..batching import Examples, batches
from ..errors import HeadwiseError, renamed

HEADS = ("base", "causal-lm", "seq2seq", "classification")
OUTPUT_KINDS = ("logits", "embeddings")
Metric = Callable[[nn.Module], float]


@dataclass
class TaskOutputs:
    """What a task's loss reads from one forward pass on a collated batch.

    ``values``: ``[B, ..., V]`` logits over V classes (kind ``"logits"``: distilled by KL) or ``[B, ..., D]``
    embeddings (kind ``"embeddings"``: distilled by a distance); ``mask``: ``[B, ...]`` bool, the positions that
    count (padding and unscored tokens False), or None when every position counts. ``head``: when set (a causal
    LM's output head), ``values`` are the hidden states ``[B, ..., D]`` whose logits are ``head(values)``; the
    losses then build the vocabulary-sized logits a chunk of positions at a time, never ``[B, ..., V]`` whole."""

    values: torch.Tensor
    kind: str
    mask: torch.Tensor | None = None
    head: nn.Module | None = None

    def __post_init__(self) -> None:
        if self.kind not in OUTPUT_KINDS:
            raise HeadwiseError(f"task output kind {self.kind!r} is not one of {', '.join(OUTPUT_KINDS)}")
        if self.head is not None and self.kind != "logits":
            raise HeadwiseError("an output head applies to logits; embeddings are their own values")

    @property
    def classes(self) -> int:
        """The size of the last dimension of the logits or embeddings (V or D)."""
        return self.head.out_features if self.head is not None else self.values.shape[-1]

    def logits(self) -> torch.Tensor:
        """The values themselves, or ``head(values)`` (``[B, ..., V]``, whole: for tests and small batches)."""
        return self.values if self.head is None else self.head(self.values)


class Task:
    """Base class of the tasks; subclasses are dataclasses of their options."""

    name: ClassVar[str]
    head: ClassVar[str]  # one of HEADS
    metric: ClassVar[str]  # the key of ``evaluate``'s main metric
    higher_is_better: ClassVar[bool] = True
    train_defaults: ClassVar[dict[str, Any]] = {"batch_size": 16, "learning_rate": 2e-5}

    def check(self) -> None:
        """Raise ``HeadwiseError`` if the data is missing or malformed (called before any model loads)."""

    def evaluate(self, model: nn.Module, tokenizer: Any, *, progress: bool | None = None) -> dict[str, float]:
        raise NotImplementedError

    def examples(self, tokenizer: Any, split: str = "train") -> Examples:
        raise NotImplementedError

    def outputs(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> TaskOutputs:
        """The model's logits or embeddings on a collated batch (one forward pass)."""
        raise NotImplementedError

    def loss_from(self, outputs: TaskOutputs, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per-example training loss ``[B]`` (float32) from ``outputs`` and the batch's labels."""
        raise NotImplementedError

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per-example training loss ``[B]`` on a collated batch."""
        return self.loss_from(self.outputs(model, batch), batch)

    def texts(self, split: str = "calibration") -> list[str]:
        """Plain input texts of a split (what ``analyze`` reads)."""
        raise NotImplementedError

    def check_model(self, model: nn.Module, tokenizer: Any) -> None:
        """Raise ``HeadwiseError`` if the model cannot run this task (wrong head, inputs beyond its context)."""
        check_head(model, self)

    # ---- shared behaviour ---------------------------------------------------------------------------------
    def batches(self, tokenizer: Any, split: str = "train", batch_size: int = 16, limit: int | None = None,
                device: torch.device | str = "cpu") -> list[dict[str, torch.Tensor]]:
        return list(batches(self.examples(tokenizer, split).head(limit), tokenizer, batch_size, device))

    def calibration_inputs(self, tokenizer: Any, limit: int | None = 256, batch_size: int = 16,
                           device: torch.device | str = "cpu") -> list[dict[str, torch.Tensor]]:
        """Model inputs (no labels) of the calibration split, for collaborative compression or analysis."""
        out = []
        for batch in self.batches(tokenizer, "calibration", batch_size, limit, device):
            out.append(model_inputs(batch))
        return out

    def metric_fn(self, tokenizer: Any, **evaluate: Any) -> Metric:
        """``fn(model) -> float``, higher is better (the main metric, negated when lower is better)."""
        sign = 1.0 if self.higher_is_better else -1.0

        def score(model: nn.Module) -> float:
            return sign * float(self.evaluate(model, tokenizer, progress=False, **evaluate)[self.metric])

        score.__name__ = self.metric if self.higher_is_better else f"-{self.metric}"
        return score

    def finetune(self, model: nn.Module, tokenizer: Any, **options: Any) -> nn.Module:
        """Former spelling of ``headwise.training.finetune(model, tokenizer, task, ...)``, one release."""
        from ..training.finetune import finetune

        return renamed(finetune, "Task.finetune", "headwise.training.finetune")(model, tokenizer, self, **options)

    def train_objective(self, objective: nn.Module, tokenizer: Any, **options: Any) -> None:
        """Former spelling of ``headwise.training.train_objective(objective, tokenizer, task, ...)``, one release."""
        from ..training.finetune import train_objective

        renamed(train_objective, "Task.train_objective", "headwise.training.train_objective")(
            objective, tokenizer, self, **options)


def model_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The entries of a collated batch that the model's forward takes (labels and scores dropped)."""
    keep = ("input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask")
    return {k: v for k, v in batch.items() if k in keep}


class TaskObjective(nn.Module):
    """``forward(**batch) -> {"loss": mean of task.loss}``: a task's loss as a module the Trainer can train."""

    def __init__(self, task: Task, model: nn.Module) -> None:
        super().__init__()
        self.task, self.model = task, model

    def forward(self, **batch: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": self.task.loss(self.model, batch).mean()}


@dataclass(frozen=True)
class HeadSpec:
    auto_class: str  # transformers Auto class
    suffixes: tuple[str, ...]  # class-name endings of models that carry this head
    what: str


HEAD_SPECS = {
    "base": HeadSpec("AutoModel", (), "a base encoder"),
    "causal-lm": HeadSpec("AutoModelForCausalLM", ("ForCausalLM", "LMHeadModel"), "a language-modelling head"),
    "seq2seq": HeadSpec("AutoModelForSeq2SeqLM", ("ForConditionalGeneration", "MTModel"), "an encoder-decoder "
                        "with a language-modelling head"),
    "classification": HeadSpec("AutoModelForSequenceClassification", ("ForSequenceClassification",),
                               "a sequence-classification head"),
}


def check_head(model: nn.Module, task: Task) -> None:
    """Raise if ``model`` lacks the head ``task`` needs (e.g. a base Llama for perplexity)."""
    spec = HEAD_SPECS[task.head]
    name = type(model).__name__
    if spec.suffixes and not name.endswith(spec.suffixes):
        raise HeadwiseError(
            f"task {task.name} needs {spec.what}, but the model is a {name}; load it with "
            f"headwise.load_model(name, task={task.name!r}) (transformers' {spec.auto_class})")
