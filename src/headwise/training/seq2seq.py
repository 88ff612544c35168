"""Sequence-to-sequence training with head penalties: ``HeadwiseSeq2SeqTrainer`` (a ``Seq2SeqTrainer`` with the
same penalties, head learning rate and gradient-accumulation scaling as ``HeadwiseTrainer``), a tokenised
parallel dataset, and ``train_translation``, the recipe the translation experiment uses (BLEU on a dev set with
``predict_with_generate``)."""

from __future__ import annotations

import tempfile
from typing import Any, Sequence

import torch
from torch import nn
from torch.utils.data import Dataset
from transformers import (DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments, TrainerCallback,
                          set_seed)

from ..errors import HeadwiseError
from ..tasks.bleu import BleuMetric
from ..tasks.corpus import ParallelCorpus
from .trainer import Penalty, PenaltyTraining


class HeadwiseSeq2SeqTrainer(PenaltyTraining, Seq2SeqTrainer):
    """``HeadwiseSeq2SeqTrainer(model, args, ..., penalties=[...], head_learning_rate=1e-2)``; with
    ``args.predict_with_generate`` and ``compute_metrics=BleuMetric(tokenizer)`` evaluation reports BLEU."""


class TranslationDataset(Dataset):
    """A ``ParallelCorpus`` tokenised once: items ``{"input_ids": [Ts], "labels": [Tt]}`` (both end with EOS),
    truncated to ``max_length`` tokens."""

    def __init__(self, corpus: ParallelCorpus, tokenizer: Any, max_length: int = 128) -> None:
        if len(corpus) == 0:
            raise HeadwiseError("the parallel corpus is empty; give at least one sentence pair")
        enc = tokenizer(corpus.source, text_target=corpus.target, truncation=True, max_length=max_length)
        self.items = [{"input_ids": s, "labels": t} for s, t in zip(enc["input_ids"], enc["labels"])]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        return self.items[i]


def train_translation(model: nn.Module, tokenizer: Any, train: ParallelCorpus, *, dev: ParallelCorpus | None = None,
                      max_steps: int = 1000, batch_size: int = 64, learning_rate: float = 1e-3,
                      warmup_ratio: float = 0.05, label_smoothing: float = 0.1, penalties: Sequence[Penalty] = (),
                      head_learning_rate: float | None = None, callbacks: Sequence[TrainerCallback] = (),
                      max_length: int = 128, eval_steps: int | None = None, seed: int = 0,
                      output_dir: str | None = None, progress: bool = True,
                      **training_args: Any) -> HeadwiseSeq2SeqTrainer:
    """Train an encoder-decoder ``model`` (in place) on ``train`` for ``max_steps`` updates (AdamW, linear decay
    after ``warmup_ratio`` warm-up, label smoothing as Voita et al.); returns the trainer (its ``state.log_history``
    holds losses, penalty metrics and, with ``dev`` and ``eval_steps``, greedy dev BLEU). Extra keyword arguments
    go to ``Seq2SeqTrainingArguments``."""
    if not getattr(model.config, "is_encoder_decoder", False):
        raise HeadwiseError(f"train_translation needs an encoder-decoder model, got {type(model).__name__}")
    if eval_steps is not None and dev is None:
        raise HeadwiseError("eval_steps needs a dev corpus (dev=ParallelCorpus)")
    set_seed(seed)
    args = Seq2SeqTrainingArguments(
        output_dir=output_dir or tempfile.mkdtemp(prefix="headwise-seq2seq-"),
        max_steps=max_steps, per_device_train_batch_size=batch_size, per_device_eval_batch_size=batch_size,
        learning_rate=learning_rate, warmup_steps=warmup_ratio, label_smoothing_factor=label_smoothing,
        eval_strategy="steps" if eval_steps else "no", eval_steps=eval_steps, predict_with_generate=True,
        generation_max_length=max_length, generation_num_beams=1, seed=seed, data_seed=seed,
        save_strategy="no", report_to="none", disable_tqdm=not progress,
        logging_steps=training_args.pop("logging_steps", 50),
        use_cpu=training_args.pop("use_cpu", not torch.cuda.is_available()), **training_args,
    )
    trainer = HeadwiseSeq2SeqTrainer(
        model=model, args=args, train_dataset=TranslationDataset(train, tokenizer, max_length),
        eval_dataset=TranslationDataset(dev, tokenizer, max_length) if dev is not None else None,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
        processing_class=tokenizer, compute_metrics=BleuMetric(tokenizer) if dev is not None else None,
        penalties=penalties, head_learning_rate=head_learning_rate, callbacks=list(callbacks),
    )
    trainer.train()
    model.eval()
    return trainer
