"""Sentence embeddings by mean pooling, in length-sorted batches, and embedding fidelity between two models."""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..batching import mean_pool
from ..errors import HeadwiseError
from ..progress import progress_bar
from ..sites import find_sites


def ensure_encoder(model: nn.Module, task: str) -> None:
    """Refuse causal decoders where a bidirectional sentence encoder is needed."""
    causal = [s for s in find_sites(model) if s.causal]
    if causal:
        raise HeadwiseError(
            f"{task} needs a bidirectional sentence encoder, but {type(model).__name__} "
            f"({model.config.model_type}) is a causal decoder; use an encoder such as the default all-MiniLM-L6-v2"
        )


@torch.no_grad()
def encode(model: nn.Module, tokenizer: Any, texts: Sequence[str], batch_size: int = 64, max_length: int | None = None,
           progress: bool | None = None, desc: str = "encoding") -> torch.Tensor:
    """Mean-pooled embeddings ``[N, D]`` (float32, on CPU), in the order of ``texts``.

    Texts are batched by length so padding stays small; ``progress=None`` shows a bar on terminals only.
    """
    if not len(texts):
        raise HeadwiseError("no texts to encode")
    device = next(model.parameters()).device
    max_length = max_length or tokenizer.model_max_length
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]), reverse=True)
    out = torch.empty(len(texts), model.config.hidden_size)
    bar = progress_bar(total=len(texts), desc=desc, unit="sent", disable=None if progress is None else not progress)
    for start in range(0, len(texts), batch_size):
        idx = order[start : start + batch_size]
        batch = tokenizer([texts[i] for i in idx], padding=True, truncation=True, max_length=max_length,
                          return_tensors="pt").to(device)
        hidden = model(**batch).last_hidden_state
        out[idx] = mean_pool(hidden, batch["attention_mask"]).float().cpu()
        bar.update(len(idx))
    bar.close()
    return out


def fidelity(
    model: nn.Module, reference: nn.Module, tokenizer: Any, texts: Sequence[str], batch_size: int = 64
) -> float:
    """Mean cosine similarity between the pooled embeddings of ``model`` and ``reference`` on ``texts``."""
    a = encode(model, tokenizer, texts, batch_size, desc="model")
    b = encode(reference, tokenizer, texts, batch_size, desc="reference")
    return F.cosine_similarity(a, b, dim=-1).mean().item()
