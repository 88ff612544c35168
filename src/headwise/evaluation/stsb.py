"""STS Benchmark: Spearman ×100 between gold scores and cosine similarity of mean-pooled embeddings."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch.nn.functional as F
from scipy.stats import pearsonr, spearmanr
from torch import nn

from .data import StsbPairs, read_stsb, stsb_file
from .embeddings import encode, ensure_encoder


@dataclass(frozen=True)
class StsbResult:
    spearman: float  # ×100
    pearson: float  # ×100
    pairs: int
    split: str
    file: str

    def as_dict(self) -> dict:
        return asdict(self)


def stsb_scores(model: nn.Module, tokenizer: Any, pairs: StsbPairs, batch_size: int = 64) -> tuple[float, float]:
    """(Spearman, Pearson) ×100 of ``model`` on ``pairs``; each distinct sentence is encoded once."""
    ensure_encoder(model, "STS-B evaluation")
    sentences = pairs.sentences()
    index = {s: i for i, s in enumerate(sentences)}
    emb = encode(model, tokenizer, sentences, batch_size, desc="STS-B")
    a = emb[[index[s] for s in pairs.first]]
    b = emb[[index[s] for s in pairs.second]]
    cos = F.cosine_similarity(a, b, dim=-1).numpy()
    return float(100 * spearmanr(cos, pairs.scores).statistic), float(100 * pearsonr(cos, pairs.scores).statistic)


def evaluate_stsb(
    model: nn.Module, tokenizer: Any, split: str = "dev", data: str | os.PathLike | None = None, batch_size: int = 64
) -> StsbResult:
    """Evaluate a sentence encoder on an STS-B split (see ``stsb_file`` for where the data is looked up)."""
    pairs = read_stsb(split, data)
    spearman, pearson = stsb_scores(model, tokenizer, pairs, batch_size)
    return StsbResult(spearman, pearson, len(pairs), split, str(stsb_file(split, data)))


def stsb_metric(tokenizer: Any, split: str = "dev", data: str | os.PathLike | None = None, batch_size: int = 64,
                limit: int | None = None) -> Callable[[nn.Module], float]:
    """STS-B Spearman ×100 of a model (mean pooling, cosine), on the first ``limit`` pairs if given."""
    pairs = read_stsb(split, data)
    if limit:
        pairs = StsbPairs(pairs.first[:limit], pairs.second[:limit], pairs.scores[:limit])

    def score(model: nn.Module) -> float:
        return stsb_scores(model, tokenizer, pairs, batch_size)[0]

    score.__name__ = f"STS-B {split} Spearman x100" + (f" (first {limit} pairs)" if limit else "")
    return score
