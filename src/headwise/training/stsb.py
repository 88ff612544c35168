"""The shared fine-tuning recipe: cosine-similarity regression on STS-B train (as sentence-transformers'
``CosineSimilarityLoss``): ``loss = mean_b (cos(u_b, v_b) − score_b / 5)²`` on mean-pooled embeddings."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset
from transformers import TrainerCallback, TrainingArguments, set_seed

from ..tasks import ensure_encoder, mean_pool, read_stsb
from ..tasks.stsb_data import StsbPairs
from .trainer import HeadwiseTrainer, Penalty

SCORE_SCALE = 5.0


class PairDataset(Dataset):
    """``(first, second, score / 5)`` triples of an ``StsbPairs`` split."""

    def __init__(self, pairs: StsbPairs) -> None:
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> tuple[str, str, float]:
        return self.pairs.first[i], self.pairs.second[i], self.pairs.scores[i] / SCORE_SCALE


@dataclass
class PairCollator:
    """Tokenises a list of pairs into ``input_ids_a/attention_mask_a/input_ids_b/attention_mask_b/labels``."""

    tokenizer: Any
    max_length: int

    def __call__(self, batch: Sequence[tuple[str, str, float]]) -> dict[str, torch.Tensor]:
        first, second, labels = zip(*batch)
        out = {}
        for side, texts in (("a", first), ("b", second)):
            enc = self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.max_length,
                                 return_tensors="pt")
            out[f"input_ids_{side}"], out[f"attention_mask_{side}"] = enc["input_ids"], enc["attention_mask"]
        out["labels"] = torch.tensor(labels, dtype=torch.float32)
        return out


class CosineRegression(nn.Module):
    """Wraps a sentence encoder: ``forward(input_ids_a, attention_mask_a, input_ids_b, attention_mask_b, labels)``
    → ``{"loss": MSE(cos(u, v), labels), "cosine": [B]}``."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return mean_pool(hidden, attention_mask)

    def forward(self, input_ids_a, attention_mask_a, input_ids_b, attention_mask_b, labels=None):
        cosine = F.cosine_similarity(self.embed(input_ids_a, attention_mask_a),
                                     self.embed(input_ids_b, attention_mask_b), dim=-1)
        out = {"cosine": cosine}
        if labels is not None:
            out["loss"] = F.mse_loss(cosine.float(), labels.float())
        return out


def finetune_stsb(
    model: nn.Module,
    tokenizer: Any,
    *,
    epochs: float = 1.0,
    max_steps: int = -1,
    batch_size: int = 16,
    learning_rate: float = 2e-5,
    warmup_ratio: float = 0.1,
    gradient_accumulation_steps: int = 1,
    penalties: Sequence[Penalty] = (),
    head_learning_rate: float | None = None,
    callbacks: Sequence[TrainerCallback] = (),
    data: str | None = None,
    limit: int | None = None,
    seed: int = 0,
    output_dir: str | None = None,
    progress: bool = True,
    **training_args: Any,
) -> nn.Module:
    """Fine-tune ``model`` (in place) on STS-B train with the cosine-similarity regression; returns the model.

    Defaults follow sentence-transformers' STS-B recipe (batch 16, lr 2e-5, 10% warm-up) for one epoch.
    ``penalties`` / ``head_learning_rate`` go to ``HeadwiseTrainer``; extra keyword arguments go to
    ``TrainingArguments``. Runs unchanged under ``torchrun`` / ``accelerate launch`` (each process gets its share).
    """
    ensure_encoder(model, "STS-B fine-tuning")
    pairs = read_stsb("train", data)
    if limit is not None:
        pairs = StsbPairs(pairs.first[:limit], pairs.second[:limit], pairs.scores[:limit])
    set_seed(seed)
    args = TrainingArguments(
        output_dir=output_dir or tempfile.mkdtemp(prefix="headwise-train-"),
        num_train_epochs=epochs, max_steps=max_steps, per_device_train_batch_size=batch_size,
        learning_rate=learning_rate, warmup_steps=warmup_ratio,
        gradient_accumulation_steps=gradient_accumulation_steps, seed=seed, data_seed=seed,
        save_strategy="no", report_to="none", remove_unused_columns=False, disable_tqdm=not progress,
        logging_steps=training_args.pop("logging_steps", 50), ddp_find_unused_parameters=True,
        use_cpu=training_args.pop("use_cpu", not torch.cuda.is_available()), **training_args,
    )
    max_length = min(int(getattr(tokenizer, "model_max_length", 512) or 512), 512)
    trainer = HeadwiseTrainer(
        model=CosineRegression(model), args=args, train_dataset=PairDataset(pairs),
        data_collator=PairCollator(tokenizer, max_length), penalties=penalties,
        head_learning_rate=head_learning_rate, callbacks=list(callbacks),
    )
    trainer.train()
    model.eval()
    return model
