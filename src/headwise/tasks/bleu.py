"""BLEU for translation models: sacrebleu corpus BLEU on detokenised strings, greedy/beam translation of a corpus,
and a ``compute_metrics`` for ``Seq2SeqTrainer(predict_with_generate=True)``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import sacrebleu
import torch
from torch import nn

from ..errors import HeadwiseError
from .corpus import ParallelCorpus
from ..progress import progress_bar


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """sacrebleu's corpus BLEU (13a tokenisation, one reference per sentence), 0..100. Texts are scored as given
    (``force=True``: already-tokenised corpora such as IWSLT14 or the synthetic pair raise no warning)."""
    if len(hypotheses) != len(references):
        raise HeadwiseError(f"BLEU needs one reference per hypothesis, got {len(hypotheses)} hypotheses and "
                            f"{len(references)} references")
    if not hypotheses:
        raise HeadwiseError("BLEU of an empty corpus is undefined; pass at least one sentence")
    return float(sacrebleu.corpus_bleu(list(hypotheses), [list(references)], force=True).score)


@dataclass
class BleuMetric:
    """``compute_metrics`` for ``Seq2SeqTrainer`` with ``predict_with_generate``: decodes generated ids and labels
    (``-100`` → pad) and returns ``{"bleu": corpus BLEU}``."""

    tokenizer: Any

    def __call__(self, eval_pred) -> dict[str, float]:
        predictions, labels = eval_pred.predictions, eval_pred.label_ids
        if isinstance(predictions, tuple):
            predictions = predictions[0]
        pad = self.tokenizer.pad_token_id
        predictions = np.where(predictions < 0, pad, predictions)
        labels = np.where(labels < 0, pad, labels)
        hypotheses = self.tokenizer.batch_decode(predictions, skip_special_tokens=True)
        references = self.tokenizer.batch_decode(labels, skip_special_tokens=True)
        return {"bleu": corpus_bleu(hypotheses, references)}


@torch.no_grad()
def translate(model: nn.Module, tokenizer: Any, sources: Sequence[str], *, batch_size: int = 100,
              max_new_tokens: int = 128, num_beams: int = 1, progress: bool = True,
              max_length: int | None = None) -> list[str]:
    """Translate ``sources`` with ``model.generate`` (greedy by default) in batches; returns detokenised strings.
    Sources are cut to ``max_length`` tokens (default: the model's positions), never beyond what the model takes."""
    from ..batching import context_length

    limit = context_length(model, tokenizer)
    max_length = min(max_length or limit or 10**9, limit or 10**9)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    out: list[str] = []
    for start in progress_bar(range(0, len(sources), batch_size), desc="translate", disable=not progress):
        enc = tokenizer(list(sources[start:start + batch_size]), padding=True, truncation=True,
                        max_length=max_length, return_tensors="pt").to(device)
        ids = model.generate(**enc, max_new_tokens=max_new_tokens, max_length=None, num_beams=num_beams,
                             do_sample=False)
        out.extend(tokenizer.batch_decode(ids, skip_special_tokens=True))
    model.train(was_training)
    return out


@dataclass
class BleuResult:
    bleu: float
    hypotheses: list[str]


def evaluate_bleu(model: nn.Module, tokenizer: Any, corpus: ParallelCorpus, **generate: Any) -> BleuResult:
    """Translate ``corpus.source`` (``translate`` options) and score against ``corpus.target``."""
    hypotheses = translate(model, tokenizer, corpus.source, **generate)
    return BleuResult(corpus_bleu(hypotheses, corpus.target), hypotheses)
