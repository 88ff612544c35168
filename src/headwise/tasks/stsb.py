"""STS Benchmark: Spearman ×100 between gold scores and cosine similarity of mean-pooled embeddings."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..batching import Examples, mean_pool, tokenize
from .base import Task, TaskOutputs
from .embeddings import encode, ensure_encoder
from .metrics import check_gold, correlations
from .stsb_data import StsbPairs, read_stsb, stsb_file

SCORE_SCALE = 5.0


@dataclass(frozen=True)
class StsbResult:
    spearman: float  # ×100
    pearson: float  # ×100
    pairs: int
    split: str
    file: str
    total_pairs: int | None = None  # pairs in the split when only the first ``pairs`` were scored (``limit``)

    def as_dict(self) -> dict:
        return asdict(self)


def stsb_scores(model: nn.Module, tokenizer: Any, pairs: StsbPairs, batch_size: int = 64,
                what: str = "STS-B") -> tuple[float, float]:
    """(Spearman, Pearson) ×100 of ``model`` on ``pairs``; each distinct sentence is encoded once. Refused (naming
    ``what``) where undefined: fewer than two pairs, equal gold scores, constant or non-finite similarities."""
    ensure_encoder(model, "STS-B evaluation")
    sentences = pairs.sentences()
    index = {s: i for i, s in enumerate(sentences)}
    emb = encode(model, tokenizer, sentences, batch_size, desc="STS-B")
    a = emb[[index[s] for s in pairs.first]]
    b = emb[[index[s] for s in pairs.second]]
    cos = F.cosine_similarity(a, b, dim=-1).numpy()
    out = correlations(cos, pairs.scores, what)
    return out["spearman"], out["pearson"]


def evaluate_stsb(
    model: nn.Module, tokenizer: Any, split: str = "dev", data: str | os.PathLike | None = None, batch_size: int = 64,
    limit: int | None = None,
) -> StsbResult:
    """Evaluate a sentence encoder on an STS-B split (see ``stsb_file`` for where the data is looked up); ``limit``:
    only its first N pairs (the result then records the split's size in ``total_pairs``)."""
    pairs = read_stsb(split, data)
    total = len(pairs)
    if limit is not None and limit < total:
        pairs = StsbPairs(pairs.first[:limit], pairs.second[:limit], pairs.scores[:limit])
    spearman, pearson = stsb_scores(model, tokenizer, pairs, batch_size, f"STS-B {stsb_file(split, data)}")
    return StsbResult(spearman, pearson, len(pairs), split, str(stsb_file(split, data)),
                      total if len(pairs) < total else None)


@dataclass
class Stsb(Task):
    """STS Benchmark with a sentence encoder: Spearman ×100 of cosine similarities of mean-pooled embeddings;
    loss ``(cos(u, v) − score / 5)²`` per pair (sentence-transformers' ``CosineSimilarityLoss``)."""

    data: str | None = None
    split: str = "dev"
    batch_size: int = 64
    limit: int | None = None

    name = "stsb"
    head = "base"
    metric = "spearman"

    def pairs(self, split: str = "eval") -> StsbPairs:
        split = {"eval": self.split, "calibration": "train"}.get(split, split)
        pairs = read_stsb(split, self.data)
        if self.limit and split == self.split:
            pairs = StsbPairs(pairs.first[: self.limit], pairs.second[: self.limit], pairs.scores[: self.limit])
        return pairs

    def check(self) -> None:
        """The eval split is read and checked (scores, sentences, enough pairs) before any model loads."""
        check_gold(self.pairs("eval").scores, f"STS-B {stsb_file(self.split, self.data)}")

    def check_model(self, model: nn.Module, tokenizer: Any) -> None:
        ensure_encoder(model, "task stsb")

    def texts(self, split: str = "calibration") -> list[str]:
        return self.pairs(split).sentences()

    def evaluate(self, model: nn.Module, tokenizer: Any, *, progress: bool | None = None) -> dict[str, float]:
        self.check_model(model, tokenizer)
        pairs = self.pairs("eval")
        spearman, pearson = stsb_scores(model, tokenizer, pairs, self.batch_size,
                                        f"STS-B {stsb_file(self.split, self.data)}")
        return {"spearman": spearman, "pearson": pearson, "pairs": len(pairs)}

    def examples(self, tokenizer: Any, split: str = "train") -> Examples:
        """Pairs ``{"input_ids_a", "input_ids_b", "score"}``; the ``"calibration"`` split: single sentences."""
        max_length = min(int(getattr(tokenizer, "model_max_length", 512) or 512), 512)
        if split == "calibration":
            ids, cut = tokenize(tokenizer, self.texts("calibration"), max_length)
            return Examples([{"input_ids": i} for i in ids], cut)
        pairs = self.pairs(split)
        a, cut_a = tokenize(tokenizer, pairs.first, max_length)
        b, cut_b = tokenize(tokenizer, pairs.second, max_length)
        return Examples([{"input_ids_a": x, "input_ids_b": y, "score": float(s) / SCORE_SCALE}
                         for x, y, s in zip(a, b, pairs.scores)], cut_a + cut_b)

    def outputs(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> TaskOutputs:
        """Mean-pooled embeddings of both sentences, ``[B, 2, D]``."""
        def embed(side: str) -> torch.Tensor:
            mask = batch[f"attention_mask_{side}"]
            return mean_pool(model(input_ids=batch[f"input_ids_{side}"], attention_mask=mask).last_hidden_state, mask)

        return TaskOutputs(torch.stack([embed("a"), embed("b")], dim=1), "embeddings")

    def loss_from(self, outputs: TaskOutputs, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        cos = F.cosine_similarity(outputs.values[:, 0], outputs.values[:, 1], dim=-1)
        return (cos.float() - batch["score"].float()) ** 2
