"""Translation: sacreBLEU of greedy or beam-search output, label (teacher-forced cross-entropy) loss.

Data: ``src_file`` / ``tgt_file`` (any aligned pair of UTF-8 files, ``.gz`` allowed), or ``data_dir`` holding
``{split}.{lang}[.gz]`` files (the Multi30k layout: ``train``, ``val``, ``test_2016_flickr``; also the
``{split}.src`` / ``{split}.tgt`` layout with ``src="src"``, ``tgt="tgt"``). Splits: ``split`` is evaluated,
``train_split`` trains, ``calibration_split`` calibrates (default: the evaluated split when only files are given).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sacrebleu
import torch
import torch.nn.functional as F
from torch import nn

from ..batching import LABEL_PAD, Examples, check_context, pad_id_of, tokenize
from ..errors import HeadwiseError
from .base import Task, TaskOutputs
from .metrics import finite_metrics, finite_outputs
from .bleu import translate
from .corpus import ParallelCorpus
from .paths import check_sizes, read_lines, shared_data


def read_parallel(src: Path, tgt: Path) -> ParallelCorpus:
    """Two aligned files, one sentence a line; refuses missing files, different lengths and empty lines."""
    lines = {}
    for path in (src, tgt):
        if not path.is_file():
            raise HeadwiseError(f"parallel file not found: {path}; pass existing --src-file/--tgt-file or a "
                                "--data-dir holding {split}.{lang}[.gz]")
        lines[path] = read_lines(path)
        empty = next((i for i, line in enumerate(lines[path], 1) if not line.strip()), None)
        if empty is not None:
            raise HeadwiseError(f"{path}:{empty} is empty; every line must hold a sentence (remove the pair)")
    if len(lines[src]) != len(lines[tgt]):
        raise HeadwiseError(f"{src} has {len(lines[src])} lines but {tgt} has {len(lines[tgt])}; parallel files "
                            "must align line by line")
    if not lines[src]:
        raise HeadwiseError(f"{src} is empty; give at least one sentence pair")
    return ParallelCorpus(lines[src], lines[tgt])


@dataclass
class Translation(Task):
    data_dir: str | None = None
    split: str = "test_2016_flickr"
    train_split: str = "train"
    calibration_split: str = "val"
    src: str = "de"
    tgt: str = "en"
    src_file: str | None = None
    tgt_file: str | None = None
    beam: int = 1
    max_new_tokens: int = 96
    max_length: int = 128
    batch_size: int = 64
    limit: int | None = None

    name = "translation"
    head = "seq2seq"
    metric = "bleu"
    train_defaults = {"batch_size": 64, "learning_rate": 3e-4}

    def __post_init__(self) -> None:
        if (self.src_file is None) != (self.tgt_file is None):
            raise HeadwiseError("give both --src-file and --tgt-file (aligned files), or --data-dir")
        if self.beam < 1:
            raise HeadwiseError(f"--beam {self.beam}: give 1 (greedy) or more beams")
        check_sizes(self.name, limit=self.limit, batch_size=self.batch_size, max_length=self.max_length,
                    max_new_tokens=self.max_new_tokens)
        self._corpora: dict[str, ParallelCorpus] = {}

    def _files(self, split: str) -> tuple[Path, Path]:
        if self.src_file is not None and split == self.split:
            return Path(self.src_file).expanduser(), Path(self.tgt_file).expanduser()
        if self.src_file is not None and self.data_dir is None:
            raise HeadwiseError(f"the {split} split needs --data-dir (only --src-file/--tgt-file were given, which "
                                "are evaluated)")
        root = Path(self.data_dir).expanduser() if self.data_dir else shared_data("multi30k", "--data-dir DIR or "
                                                                                  "--src-file F --tgt-file F")
        if not root.is_dir():
            raise HeadwiseError(f"--data-dir {root} is not a folder; give the folder of {{split}}.{{lang}} files")
        found = []
        for lang in (self.src, self.tgt):
            for name in (f"{split}.{lang}", f"{split}.{lang}.gz"):
                if (root / name).is_file():
                    found.append(root / name)
                    break
            else:
                raise HeadwiseError(f"{root} has no {split}.{lang} or {split}.{lang}.gz; check --split/--src/--tgt")
        return found[0], found[1]

    def corpus(self, split: str = "eval") -> ParallelCorpus:
        """Sentence pairs of a split (``"eval"``, ``"train"``, ``"calibration"`` or a split name)."""
        name = {"eval": self.split, "train": self.train_split, "calibration": self.calibration_split}.get(split, split)
        if name == self.calibration_split and self.src_file is not None and self.data_dir is None:
            name = self.split
        if name not in self._corpora:
            corpus = read_parallel(*self._files(name))
            self._corpora[name] = corpus.head(self.limit) if split == "eval" else corpus
        return self._corpora[name]

    def check(self) -> None:
        self.corpus("eval")

    def texts(self, split: str = "calibration") -> list[str]:
        return self.corpus(split).source

    def examples(self, tokenizer: Any, split: str = "train") -> Examples:
        corpus = self.corpus(split)
        src, cut_src = tokenize(tokenizer, corpus.source, self.max_length)
        tgt, cut_tgt = tokenize(tokenizer, corpus.target, self.max_length, target=True)
        return Examples([{"input_ids": s, "labels": t} for s, t in zip(src, tgt)], cut_src + cut_tgt)

    def check_model(self, model: nn.Module, tokenizer: Any) -> None:
        super().check_model(model, tokenizer)
        check_context(model, tokenizer, self.max_length)

    def evaluate(self, model: nn.Module, tokenizer: Any, *, progress: bool | None = None) -> dict[str, float]:
        self.check_model(model, tokenizer)
        corpus = self.corpus("eval")
        _, cut = tokenize(tokenizer, corpus.source, self.max_length)
        if cut:
            print(f"headwise: note: {cut} of {len(corpus)} source sentences are longer than --max-length "
                  f"{self.max_length} tokens and are cut to it for translation", file=sys.stderr)
        probe = self.batches(tokenizer, "eval", batch_size=4, limit=4, device=next(model.parameters()).device)[0]
        with torch.no_grad():  # teacher-forced logits of the first pairs: a generation from NaN is no BLEU
            finite_outputs(self.outputs(model, probe).values, "translation")
        hypotheses = translate(model, tokenizer, corpus.source, batch_size=self.batch_size,
                               max_new_tokens=self.max_new_tokens, num_beams=self.beam,
                               progress=progress is not False, max_length=self.max_length)
        refs = [corpus.target]
        return finite_metrics({"bleu": float(sacrebleu.corpus_bleu(hypotheses, refs).score),
                               "chrf": float(sacrebleu.corpus_chrf(hypotheses, refs).score), "sentences": len(corpus),
                               "beam": self.beam, "truncated": cut}, "translation")

    def outputs(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> TaskOutputs:
        """Teacher-forced target logits ``[B, T, V]``, real target tokens masked."""
        labels = batch["labels"]
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).logits
        return TaskOutputs(logits, "logits", labels != LABEL_PAD)

    def loss_from(self, outputs: TaskOutputs, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean target-token cross-entropy per sentence pair ``[B]`` (teacher forcing)."""
        labels, real = batch["labels"], outputs.mask
        nll = F.cross_entropy(outputs.values.float().transpose(1, 2), labels.clamp(min=0), reduction="none")
        return (nll * real).sum(1) / real.sum(1).clamp(min=1)

    def calibration_inputs(self, tokenizer: Any, limit: int | None = 256, batch_size: int = 16,
                           device: torch.device | str = "cpu",
                           decoder_start_token_id: int | None = None) -> list[dict[str, torch.Tensor]]:
        """Source inputs plus teacher-forced decoder inputs (labels shifted right behind the start token,
        default: the pad token, as Marian starts)."""
        start = pad_id_of(tokenizer) if decoder_start_token_id is None else decoder_start_token_id
        out = []
        for batch in self.batches(tokenizer, "calibration", batch_size, limit, device):
            labels = batch["labels"]
            shifted = torch.cat([torch.full_like(labels[:, :1], start), labels[:, :-1]], dim=1)
            real = torch.cat([torch.ones_like(labels[:, :1]), (labels[:, :-1] != LABEL_PAD).long()], dim=1)
            out.append({"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
                        "decoder_input_ids": shifted.masked_fill(real == 0, start), "decoder_attention_mask": real})
        return out
