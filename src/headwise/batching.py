"""The one batching path (core): tokenised examples become right-padded tensors, under one truncation policy.

Two entries share one padder (``collate``):

- ``batches(examples, tokenizer, batch_size)``: a task's tokenised examples (dicts of token-id lists and labels)
  → dicts of ``[B, T]`` / ``[B]`` tensors (tasks, training, recovery, calibration);
- ``text_batches(tokenizer, texts, batch_size, max_length)``: raw texts → ``Batch`` with real-token and
  special-token masks and each text's index (analysis, importance, mixing distances).

Padding is done here rather than by the tokenizer so that tokenizers without a pad token (GPT-2) work and
causal models see right padding (their positions then start at 0 for every sentence).

Truncation policy: a text longer than ``max_length`` tokens is cut on the right by the tokenizer (special tokens
kept) and the number of cut examples is reported (``truncated`` in ``Examples``); a ``max_length`` beyond the
model's context is refused (``check_context``). Language modelling cuts its token stream into windows of
``max_length`` instead, so it never truncates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch
from torch import nn

from .errors import HeadwiseError

LABEL_PAD = -100  # ignored by cross-entropy

Example = dict[str, Any]  # token-id lists ("input_ids", "labels", …) and scalar fields ("label", "score")


@dataclass
class Examples:
    """Tokenised examples of one split, and how many of them were truncated."""

    items: list[Example]
    truncated: int = 0
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.items)

    def head(self, n: int | None) -> "Examples":
        return self if n is None else Examples(self.items[:n], self.truncated, self.source, self.meta)


@dataclass
class Batch:
    """``input_ids``/``attention_mask`` ``[B, T]`` for the model; ``real``/``special`` ``[B, T]`` bool;
    ``index``: the position of each sentence in the caller's list."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    real: torch.Tensor
    special: torch.Tensor
    index: list[int]

    @property
    def inputs(self) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask}

    def repeat(self, copies: int) -> dict[str, torch.Tensor]:
        """Model inputs with the batch repeated ``copies`` times (copy-major: copy ``c`` is rows ``c·B..``)."""
        return {k: v.repeat(copies, 1) for k, v in self.inputs.items()}


def pad_value(key: str, pad_id: int) -> int:
    """Pad ``labels`` with -100, masks (``attention_mask``, ``special_tokens_mask``, …) with 0 and token ids with
    the tokenizer's pad id."""
    if key.startswith("labels"):
        return LABEL_PAD
    if key.endswith("mask"):
        return 0
    return pad_id


def pad_id_of(tokenizer: Any) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


def collate(examples: Sequence[Example], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``[B, T]`` tensors for list fields (masks built for every ``input_ids*`` field) and ``[B]``
    tensors for scalar fields (float for floats, long for ints)."""
    if not examples:
        raise HeadwiseError("cannot batch zero examples")
    out: dict[str, torch.Tensor] = {}
    for key in examples[0]:
        values = [ex[key] for ex in examples]
        if isinstance(values[0], (list, tuple)):
            width = max(len(v) for v in values)
            fill = pad_value(key, pad_id)
            out[key] = torch.tensor([list(v) + [fill] * (width - len(v)) for v in values], dtype=torch.long)
            if key.startswith("input_ids"):
                mask_key = key.replace("input_ids", "attention_mask")
                out[mask_key] = torch.tensor([[1] * len(v) + [0] * (width - len(v)) for v in values])
        else:
            out[key] = torch.tensor(values, dtype=torch.float32 if isinstance(values[0], float) else torch.long)
    return out


def batches(examples: Examples | Sequence[Example], tokenizer: Any, batch_size: int,
            device: torch.device | str = "cpu", sort: bool = False) -> Iterator[dict[str, torch.Tensor]]:
    """Batches of ``batch_size`` examples (longest first when ``sort``), collated and moved to ``device``."""
    items = examples.items if isinstance(examples, Examples) else list(examples)
    order = list(range(len(items)))
    if sort:
        order.sort(key=lambda i: -len(items[i].get("input_ids", ())))
    for start in range(0, len(order), batch_size):
        chunk = [items[i] for i in order[start:start + batch_size]]
        yield {k: v.to(device) for k, v in collate(chunk, pad_id_of(tokenizer)).items()}


def text_batches(tokenizer: Any, texts: Sequence[str], batch_size: int, max_length: int,
                 device: torch.device | str = "cpu", index: Sequence[int] | None = None,
                 sort: bool = True) -> Iterator[Batch]:
    """Right-padded batches of ``texts``, longest first when ``sort``; ``index`` labels the texts (default
    0..N-1). Texts that tokenise to no token at all are skipped."""
    index = list(range(len(texts))) if index is None else list(index)
    if not len(texts):
        return
    enc = tokenizer(list(texts), truncation=True, max_length=max_length, return_special_tokens_mask=True)
    examples = [{"input_ids": ids, "special_tokens_mask": special}
                for ids, special in zip(enc["input_ids"], enc["special_tokens_mask"])]
    order = [k for k in range(len(texts)) if len(examples[k]["input_ids"])]
    if sort:
        order.sort(key=lambda k: -len(examples[k]["input_ids"]))
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        padded = collate([examples[k] for k in chunk], pad_id_of(tokenizer))
        real = padded["attention_mask"].bool()
        yield Batch(padded["input_ids"].to(device), padded["attention_mask"].to(device), real.to(device),
                    padded["special_tokens_mask"].bool().to(device), [index[k] for k in chunk])


def tokenize(tokenizer: Any, texts: Sequence[str], max_length: int, target: bool = False,
             **kwargs: Any) -> tuple[list[list[int]], int]:
    """Token ids of ``texts`` (as targets: ``text_target=``) cut to ``max_length`` (the truncation policy) and
    how many were cut. An empty text is refused."""
    empty = next((i for i, t in enumerate(texts) if not t.strip()), None)
    if empty is not None:
        raise HeadwiseError(f"text {empty + 1} is empty; remove it from the data (every example needs text)")

    def run(**extra: Any) -> list[list[int]]:
        texts_arg = {"text_target": list(texts)} if target else {"text": list(texts)}
        return tokenizer(**texts_arg, **kwargs, **extra)["input_ids"]

    full = run()
    cut = sum(len(ids) > max_length for ids in full)
    return (run(truncation=True, max_length=max_length), cut) if cut else (full, 0)


def context_length(model: nn.Module, tokenizer: Any = None) -> int | None:
    """The longest input the model takes: ``max_position_embeddings`` (or ``n_positions``), else the tokenizer's
    ``model_max_length`` when it is a real limit; None when neither says."""
    config = getattr(model, "config", None)
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    limit = getattr(tokenizer, "model_max_length", None)
    return int(limit) if isinstance(limit, int) and 0 < limit < 10**6 else None


def check_context(model: nn.Module, tokenizer: Any, max_length: int, flag: str = "--max-length") -> int:
    """``max_length`` if the model can take it; a clear error otherwise."""
    if max_length < 2:
        raise HeadwiseError(f"{flag} {max_length}: give at least 2 tokens")
    limit = context_length(model, tokenizer)
    if limit is not None and max_length > limit:
        raise HeadwiseError(f"{flag} {max_length} is longer than the model's context of {limit} tokens; "
                            f"use {flag} {limit} or less")
    return max_length


def resolve_max_length(model: nn.Module, tokenizer: Any, max_length: int | None) -> int:
    """``max_length`` when given, else the shorter of the tokenizer's and the model's limits (512 when the model
    does not say): the default cut of ``text_batches``."""
    if max_length:
        return int(max_length)
    limit = int(getattr(tokenizer, "model_max_length", 0) or 0) or 10**9
    positions = getattr(model.config, "max_position_embeddings", None)
    return int(min(limit, positions)) if positions else min(limit, 512)


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, T, D]``, ``[B, T]`` → ``[B, D]``: the mean over real tokens."""
    weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)


def pooled(model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Unit-norm mean-pooled last hidden states ``[B, D]`` (float32) of the model's base (a model with a task
    head, e.g. ``LlamaForCausalLM``, is pooled below its head)."""
    hidden = getattr(model, "base_model", model)(**inputs).last_hidden_state
    return torch.nn.functional.normalize(mean_pool(hidden, inputs["attention_mask"]).float(), dim=-1)
