"""Tokenised batches and pooling (core): right padding, real-token and special-token masks, mean pooling.

Padding is done here rather than by the tokenizer so that tokenizers without a pad token (GPT-2) work and
causal models see right padding (their positions then start at 0 for every sentence).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch
from torch import nn



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


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, T, D]``, ``[B, T]`` → ``[B, D]``: the mean over real tokens."""
    weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)


def resolve_max_length(model: nn.Module, tokenizer: Any, max_length: int | None) -> int:
    if max_length:
        return int(max_length)
    limit = int(getattr(tokenizer, "model_max_length", 0) or 0) or 10**9
    positions = getattr(model.config, "max_position_embeddings", None)
    return int(min(limit, positions)) if positions else min(limit, 512)


def _pad(ids: list[list[int]], specials: list[list[int]], index: list[int], pad: int, device) -> Batch:
    B, T = len(ids), max(len(x) for x in ids)
    input_ids = torch.full((B, T), pad, dtype=torch.long)
    real = torch.zeros(B, T, dtype=torch.bool)
    special = torch.zeros(B, T, dtype=torch.bool)
    for b, (row, spec) in enumerate(zip(ids, specials)):
        input_ids[b, : len(row)] = torch.tensor(row)
        real[b, : len(row)] = True
        special[b, : len(row)] = torch.tensor(spec, dtype=torch.bool)
    return Batch(input_ids.to(device), real.long().to(device), real.to(device), special.to(device), index)


def batches(tokenizer: Any, texts: Sequence[str], batch_size: int, max_length: int,
            device: torch.device | str = "cpu", index: Sequence[int] | None = None,
            sort: bool = True) -> Iterator[Batch]:
    """Right-padded batches of ``texts``, longest first when ``sort``; ``index`` labels the texts (default
    0..N-1). Texts that tokenise to no token at all are skipped."""
    index = list(range(len(texts))) if index is None else list(index)
    if not len(texts):
        return
    enc = tokenizer(list(texts), truncation=True, max_length=max_length, return_special_tokens_mask=True)
    ids, specials = enc["input_ids"], enc["special_tokens_mask"]
    order = [k for k in range(len(texts)) if len(ids[k])]
    if sort:
        order.sort(key=lambda k: -len(ids[k]))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        yield _pad([ids[k] for k in chunk], [specials[k] for k in chunk], [index[k] for k in chunk], pad, device)


def pooled(model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Unit-norm mean-pooled last hidden states ``[B, D]`` (float32) of the model's base (a model with a task
    head, e.g. ``LlamaForCausalLM``, is pooled below its head)."""
    hidden = getattr(model, "base_model", model)(**inputs).last_hidden_state
    return torch.nn.functional.normalize(mean_pool(hidden, inputs["attention_mask"]).float(), dim=-1)
