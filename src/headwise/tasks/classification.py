"""Sentence(-pair) classification and regression: CSV / TSV / JSONL files with text, optional pair and label
columns, or a GLUE task name (``glue:sst2``, needs internet and the ``datasets`` package).

Metrics (×100, as GLUE defines them): accuracy; F1 of class 1 for two classes, macro F1 otherwise; Matthews
correlation; for float labels (regression, one output) Pearson and Spearman. The main metric follows GLUE:
Matthews for CoLA, Spearman for regression, accuracy otherwise.

Splits: ``data`` is a file or a folder. A folder holds ``train`` / ``dev`` (or ``validation``) / ``test`` files
(``.csv``, ``.tsv`` or ``.jsonl``); a single file serves both: its first 90% of rows train, the last 10% evaluate.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..batching import Examples, batches, tokenize
from ..errors import HeadwiseError
from ..io.files import read_text
from ..batching import check_context
from .base import Task, TaskOutputs
from ..progress import progress_bar
from .paths import check_sizes

TRAIN_SHARE = 0.9
SUFFIXES = (".csv", ".tsv", ".jsonl")
SPLIT_NAMES = {"train": ("train",), "eval": ("dev", "validation", "val"), "test": ("test",)}
# GLUE: (text column, pair column, main metric); regression for stsb
GLUE = {"cola": ("sentence", None, "matthews"), "sst2": ("sentence", None, "accuracy"),
        "mrpc": ("sentence1", "sentence2", "accuracy"), "qqp": ("question1", "question2", "accuracy"),
        "stsb": ("sentence1", "sentence2", "spearman"), "mnli": ("premise", "hypothesis", "accuracy"),
        "qnli": ("question", "sentence", "accuracy"), "rte": ("sentence1", "sentence2", "accuracy"),
        "wnli": ("sentence1", "sentence2", "accuracy")}


def read_table(path: Path) -> list[dict[str, Any]]:
    """Rows of a CSV, TSV (header line) or JSONL file."""
    if path.suffix not in SUFFIXES:
        raise HeadwiseError(f"{path}: unknown table format; use .csv, .tsv or .jsonl")
    text = read_text(path)
    if path.suffix == ".jsonl":
        rows = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise HeadwiseError(f"{path}:{number}: not JSON ({err.msg})") from None
        return rows
    return list(csv.DictReader(text.splitlines(), delimiter="\t" if path.suffix == ".tsv" else ","))


def binary_f1(gold: np.ndarray, pred: np.ndarray) -> float:
    tp = float(((pred == 1) & (gold == 1)).sum())
    fp, fn = float(((pred == 1) & (gold != 1)).sum()), float(((pred != 1) & (gold == 1)).sum())
    return 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)


def matthews(gold: np.ndarray, pred: np.ndarray) -> float:
    """Multi-class Matthews correlation (Gorodkin's R_K, as sklearn)."""
    classes = np.union1d(gold, pred)
    c = np.array([[np.sum((gold == a) & (pred == b)) for b in classes] for a in classes], dtype=np.float64)
    t, p, n = c.sum(1), c.sum(0), c.sum()
    cov = np.trace(c) * n - t @ p
    denom = np.sqrt((n * n - p @ p) * (n * n - t @ t))
    return 0.0 if denom == 0 else float(cov / denom)


def classification_metrics(gold: np.ndarray, pred: np.ndarray, classes: int) -> dict[str, float]:
    f1 = binary_f1(gold, pred) if classes == 2 else float(np.mean([binary_f1(gold == k, pred == k)
                                                                   for k in range(classes)]))
    return {"accuracy": 100 * float((gold == pred).mean()), "f1": 100 * f1, "matthews": 100 * matthews(gold, pred)}


def regression_metrics(gold: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    from scipy.stats import pearsonr, spearmanr

    return {"pearson": 100 * float(pearsonr(pred, gold).statistic),
            "spearman": 100 * float(spearmanr(pred, gold).statistic)}


@dataclass
class Classification(Task):
    """``data``: a file, a folder of split files, or ``glue:<task>``; ``*_column``: where text, pair and label
    are (``pair_column=None``: single sentences; by default ``pair`` is used when present)."""

    data: str | None = None
    text_column: str = "text"
    pair_column: str | None = "pair"
    label_column: str = "label"
    split: str = "eval"
    max_length: int = 128
    batch_size: int = 32
    limit: int | None = None

    name = "classification"
    head = "classification"
    metric = "accuracy"

    def __post_init__(self) -> None:
        if self.data is None:
            raise HeadwiseError("task classification needs --data FILE|FOLDER (csv/tsv/jsonl with text, pair and "
                                "label columns) or --data glue:<task>")
        check_sizes(self.name, limit=self.limit, batch_size=self.batch_size, max_length=self.max_length)
        self._rows: dict[str, list[dict[str, Any]]] = {}
        self._pair_given = self.pair_column != "pair"
        if self.glue:
            name = self.data.split(":", 1)[1]
            if name not in GLUE:
                raise HeadwiseError(f"unknown GLUE task {name!r}; use one of {', '.join(GLUE)}")
            self.text_column, self.pair_column, self.metric = GLUE[name]
            self._pair_given = True

    @property
    def glue(self) -> bool:
        return self.data.startswith("glue:")

    # ---- data ---------------------------------------------------------------------------------------------
    def rows(self, split: str = "eval") -> list[dict[str, Any]]:
        split = "train" if split == "calibration" else split
        if split not in self._rows:
            rows = self._glue_rows(split) if self.glue else self._file_rows(split)
            self._check_columns(rows, split)
            self._rows[split] = rows[: self.limit] if split == "eval" and self.limit else rows
        return self._rows[split]

    def _file_rows(self, split: str) -> list[dict[str, Any]]:
        path = Path(self.data).expanduser()
        if path.is_file():
            rows = read_table(path)
            cut = int(len(rows) * TRAIN_SHARE)
            return rows[:cut] if split == "train" else rows[cut:]
        if not path.is_dir():
            raise HeadwiseError(f"classification data not found: {path}; pass a .csv/.tsv/.jsonl file or a folder "
                                "of train/dev/test files")
        for stem in SPLIT_NAMES.get(split, (split,)):
            for suffix in SUFFIXES:
                if (path / f"{stem}{suffix}").is_file():
                    return read_table(path / f"{stem}{suffix}")
        raise HeadwiseError(f"{path} has no {split} file ({'/'.join(SPLIT_NAMES.get(split, (split,)))} with "
                            f"{', '.join(SUFFIXES)}); add it or pass a single file")

    def _glue_rows(self, split: str) -> list[dict[str, Any]]:
        name = self.data.split(":", 1)[1]
        try:
            import datasets

            data = datasets.load_dataset("glue", name, split={"train": "train", "eval": "validation"}.get(split, split)
                                         if name != "mnli" else {"train": "train"}.get(split, "validation_matched"))
        except Exception as err:  # noqa: BLE001 - offline or missing package: one message
            raise HeadwiseError(f"could not load GLUE {name} ({str(err).splitlines()[0]}); it needs internet and "
                                "the datasets package, or pass --data FILE") from err
        return [dict(row) for row in data]

    def _check_columns(self, rows: list[dict[str, Any]], split: str) -> None:
        if not rows:
            raise HeadwiseError(f"classification data {self.data} ({split}) holds no rows")
        columns = list(rows[0])
        for flag, column in (("--text-column", self.text_column), ("--label-column", self.label_column)):
            if column not in columns:
                raise HeadwiseError(f"{self.data} has no column {column!r} (columns: {', '.join(columns)}); pass "
                                    f"{flag} NAME")
        if self.pair_column is not None and self.pair_column not in columns:
            if self._pair_given:
                raise HeadwiseError(f"{self.data} has no column {self.pair_column!r} (columns: "
                                    f"{', '.join(columns)}); pass --pair-column NAME or leave it out")
            self.pair_column = None

    def check(self) -> None:
        self.rows("eval")
        if self.is_regression() and self.metric == "accuracy":
            self.metric = "spearman"

    def texts(self, split: str = "calibration") -> list[str]:
        return [str(r[self.text_column]) for r in self.rows(split)]

    def is_regression(self) -> bool:
        labels = [r[self.label_column] for r in self.rows("eval")]
        try:
            values = [float(x) for x in labels]
        except (TypeError, ValueError):
            return False
        return any(v != int(v) for v in values) or self.metric in ("pearson", "spearman")

    def label_names(self) -> list[str]:
        """Class names in id order: integer labels as they are, others sorted (train and eval together)."""
        seen = {str(r[self.label_column]) for split in ("train", "eval") for r in self._rows_if_any(split)}
        if all(s.lstrip("-").isdigit() for s in seen):
            return [str(k) for k in range(max(int(s) for s in seen) + 1)]
        return sorted(seen)

    def _rows_if_any(self, split: str) -> list[dict[str, Any]]:
        try:
            return self.rows(split)
        except HeadwiseError:
            if split == "eval":
                raise
            return []

    def examples(self, tokenizer: Any, split: str = "train") -> Examples:
        rows = self.rows(split)
        text = [str(r[self.text_column]) for r in rows]
        if self.pair_column is None:
            ids, cut = tokenize(tokenizer, text, self.max_length)
        else:
            _, cut = tokenize(tokenizer, [str(r[self.pair_column]) for r in rows], self.max_length)
            enc = tokenizer(text, [str(r[self.pair_column]) for r in rows], truncation=True,
                            max_length=self.max_length)
            ids = enc["input_ids"]
        if self.is_regression():
            labels = [float(r[self.label_column]) for r in rows]
        else:
            index = {name: i for i, name in enumerate(self.label_names())}
            labels = [index[str(r[self.label_column])] for r in rows]
        return Examples([{"input_ids": i, "label": y} for i, y in zip(ids, labels)], cut)

    # ---- metrics and loss -----------------------------------------------------------------------------------
    def check_model(self, model: nn.Module, tokenizer: Any) -> None:
        super().check_model(model, tokenizer)
        check_context(model, tokenizer, self.max_length)
        outputs = int(model.config.num_labels)
        want = 1 if self.is_regression() else len(self.label_names())
        if outputs != want:
            raise HeadwiseError(f"the model's classification head has {outputs} outputs but {self.data} needs "
                                f"{want}; load it with new_head=True to start a fresh {want}-way head")

    @torch.no_grad()
    def evaluate(self, model: nn.Module, tokenizer: Any, *, progress: bool | None = None) -> dict[str, float]:
        self.check_model(model, tokenizer)
        device = next(model.parameters()).device
        data = self.examples(tokenizer, "eval")
        preds, gold = [], []
        for batch in progress_bar(list(batches(data, tokenizer, self.batch_size, device)), desc="classify",
                                  disable=None if progress is None else not progress):
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
            preds.append(logits[:, 0] if self.is_regression() else logits.argmax(-1))
            gold.append(batch["label"])
        pred, true = torch.cat(preds).cpu().numpy(), torch.cat(gold).cpu().numpy()
        out = regression_metrics(true, pred) if self.is_regression() else \
            classification_metrics(true, pred, len(self.label_names()))
        return out | {"examples": len(data), "truncated": data.truncated}

    def outputs(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> TaskOutputs:
        """Class logits ``[B, C]``; a regression's predicted value ``[B, 1]`` is an embedding (no distribution)."""
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return TaskOutputs(logits, "embeddings" if self.is_regression() else "logits")

    def loss_from(self, outputs: TaskOutputs, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Cross-entropy per example ``[B]`` (squared error for regression)."""
        logits = outputs.values.float()
        if self.is_regression():
            return (logits[:, 0] - batch["label"].float()) ** 2
        return F.cross_entropy(logits, batch["label"], reduction="none")
