"""Sentence(-pair) classification and regression: CSV / TSV / JSONL files with text, optional pair and label
columns, or a GLUE task name (``glue:sst2``, needs internet and the ``datasets`` package).

Labels: the classes are the training split's distinct labels (the eval split's when there is no training split),
numbers in numeric order (labels 1/2 are two classes, -1/1 too; ``2.0`` is ``2``), other names sorted. Before any
work, a row without a label, an empty, null, nan or inf label, a single class and an eval label the training split
lacks are refused, naming the file and line.

Metrics (×100, as GLUE defines them): accuracy; F1 of the second class for two classes, macro F1 otherwise; Matthews
correlation; for float labels (regression, one output) Pearson and Spearman (refused where undefined). The main
metric follows GLUE: Matthews for CoLA, Spearman for regression, accuracy otherwise.

Splits: ``data`` is a file or a folder. A folder holds ``train`` / ``dev`` (or ``validation``) / ``test`` files
(``.csv``, ``.tsv`` or ``.jsonl``); a single file serves both: its first 90% of rows train, the last 10% evaluate.
``split`` is the split evaluated (``eval``, its aliases ``dev``/``validation``/``val``, ``train`` or ``test``); a
single file has no test rows and is refused for ``test``.
"""

from __future__ import annotations

import csv
import io
import json
import math
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
from .metrics import check_gold, correlations, finite_metrics, finite_outputs
from ..progress import progress_bar
from .paths import check_sizes

TRAIN_SHARE = 0.9
SUFFIXES = (".csv", ".tsv", ".jsonl")
SPLIT_NAMES = {"train": ("train",), "eval": ("dev", "validation", "val"), "test": ("test",)}
SPLIT_ALIASES = {"dev": "eval", "validation": "eval", "val": "eval"}
# GLUE: (text column, pair column, main metric); regression for stsb
GLUE = {"cola": ("sentence", None, "matthews"), "sst2": ("sentence", None, "accuracy"),
        "mrpc": ("sentence1", "sentence2", "accuracy"), "qqp": ("question1", "question2", "accuracy"),
        "stsb": ("sentence1", "sentence2", "spearman"), "mnli": ("premise", "hypothesis", "accuracy"),
        "qnli": ("question", "sentence", "accuracy"), "rte": ("sentence1", "sentence2", "accuracy"),
        "wnli": ("sentence1", "sentence2", "accuracy")}


@dataclass(frozen=True)
class Table:
    """Rows of a data file and where each came from: ``lines[i]`` is the line number of ``rows[i]``."""

    source: str  # the file, or ``glue:<task> <split>``
    rows: list[dict[str, Any]]
    lines: list[int]

    def where(self, i: int) -> str:
        return f"{self.source}:{self.lines[i]}"

    def head(self, n: int | None) -> "Table":
        return self if n is None else Table(self.source, self.rows[:n], self.lines[:n])

    def tail(self, start: int) -> "Table":
        return Table(self.source, self.rows[start:], self.lines[start:])


def read_table(path: Path) -> Table:
    """Rows of a CSV, TSV (header line) or JSONL file (one JSON object a line), with their line numbers."""
    if path.suffix not in SUFFIXES:
        raise HeadwiseError(f"{path}: unknown table format; use .csv, .tsv or .jsonl")
    text = read_text(path)
    rows, lines = [], []
    if path.suffix == ".jsonl":
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    row = json.loads(line)
                except (json.JSONDecodeError, RecursionError) as err:
                    raise HeadwiseError(f"{path}:{number}: not JSON ({getattr(err, 'msg', 'nested too deeply')}); "
                                        "write one JSON object a line") from None
                if not isinstance(row, dict):
                    raise HeadwiseError(f"{path}:{number}: a {type(row).__name__}, not a JSON object; write one "
                                        'object a line, e.g. {"text": "...", "label": "pos"}')
                rows.append(row)
                lines.append(number)
        return Table(str(path), rows, lines)
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter="\t" if path.suffix == ".tsv" else ",")
    try:
        for row in reader:
            if None in row:
                raise HeadwiseError(f"{path}:{reader.line_num}: more cells than the header has columns "
                                    f"({len(reader.fieldnames or [])}); quote cells that hold the delimiter")
            rows.append(row)
            lines.append(reader.line_num)
    except csv.Error as err:
        raise HeadwiseError(f"{path}:{reader.line_num}: not valid {path.suffix[1:].upper()} ({err}); fix the "
                            "quoting on that line") from None
    return Table(str(path), rows, lines)


def _number(name: str) -> float | None:
    try:
        return float(name)
    except ValueError:
        return None


def check_labels(table: Table, column: str) -> list[str]:
    """The class name of every row's label (its text, stripped; whole numbers as integers: ``2.0`` is ``2``);
    refuses, naming the file and line, a missing or empty label, a JSON list or object, and ``nan``/``inf``."""
    names = []
    for i, row in enumerate(table.rows):
        value = row.get(column)
        if value is None:
            raise HeadwiseError(f"{table.where(i)}: no {column!r} label in this row; give every row a label (or "
                                "remove the row)")
        if isinstance(value, (dict, list)):
            raise HeadwiseError(f"{table.where(i)}: the {column!r} label is a JSON {type(value).__name__}; a label "
                                "is a class name or a number")
        name = str(value).strip()
        if not name:
            raise HeadwiseError(f"{table.where(i)}: the {column!r} label is empty; give every row a label (or "
                                "remove the row)")
        number = _number(name)
        if number is not None and not math.isfinite(number):
            raise HeadwiseError(f"{table.where(i)}: the {column!r} label is {name!r}, not a finite number; fix or "
                                "remove the row")
        names.append(str(int(number)) if number is not None and number.is_integer() else name)
    return names


def check_texts(table: Table, column: str) -> None:
    """Refuse a row whose text column is missing, null or not text, naming its file and line."""
    for i, row in enumerate(table.rows):
        if not isinstance(row.get(column), (str, int, float)) or isinstance(row.get(column), bool):
            raise HeadwiseError(f"{table.where(i)}: no text in column {column!r} (got {row.get(column)!r}); give "
                                "every row its text")


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
        self.split = SPLIT_ALIASES.get(self.split, self.split)
        if self.split not in SPLIT_NAMES:
            raise HeadwiseError(f"classification --split {self.split!r}: use train, eval (dev, validation) or test")
        self._tables: dict[str, Table | None] = {}
        self._labels: dict[str, list[str]] = {}
        self._classes: list[str] | None = None
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
    def _name(self, split: str) -> str:
        """The split read for ``split``: ``calibration`` reads ``train``, ``eval`` the evaluated ``self.split``."""
        return "train" if split == "calibration" else self.split if split == "eval" else split

    def table(self, split: str = "eval") -> Table:
        """The rows of ``split`` (``calibration`` reads ``train``, ``eval`` the split evaluated), their columns and
        labels checked."""
        table = self._table_if_any(split)
        if table is None:
            name = self._name(split)
            raise HeadwiseError(f"classification data {self.data} has no {name} rows (a folder needs a {name} file, "
                                f"{'/'.join(SPLIT_NAMES.get(name, (name,)))} with {', '.join(SUFFIXES)}; a single "
                                "file trains on its first 90% of rows); add them")
        return table

    def rows(self, split: str = "eval") -> list[dict[str, Any]]:
        return self.table(split).rows

    def _table_if_any(self, split: str) -> Table | None:
        """``split``'s checked table, None when the data has no such split (no file, or an empty share)."""
        split = self._name(split)
        if split not in self._tables:
            table = self._glue_rows(split) if self.glue else self._file_rows(split)
            if table is not None and table.rows:
                self._check_columns(table)
                self._labels[split] = check_labels(table, self.label_column)
                table = table.head(self.limit) if split == self.split else table
                self._labels[split] = self._labels[split][: len(table.rows)]
            self._tables[split] = table if table is not None and table.rows else None
        return self._tables[split]

    def _file_rows(self, split: str) -> Table | None:
        path = Path(self.data).expanduser()
        if path.is_file():
            table = read_table(path)
            cut = int(len(table.rows) * TRAIN_SHARE)
            if split == "test":
                raise HeadwiseError(f"{path} is one file: its first {TRAIN_SHARE:.0%} of rows train and the rest "
                                    "evaluate (--split eval or train); for --split test pass a folder with a test file")
            return table.head(cut) if split == "train" else table.tail(cut)
        if not path.is_dir():
            raise HeadwiseError(f"classification data not found: {path}; pass a .csv/.tsv/.jsonl file or a folder "
                                "of train/dev/test files")
        for stem in SPLIT_NAMES.get(split, (split,)):
            for suffix in SUFFIXES:
                if (path / f"{stem}{suffix}").is_file():
                    return read_table(path / f"{stem}{suffix}")
        if split == "train":
            return None
        raise HeadwiseError(f"{path} has no {split} file ({'/'.join(SPLIT_NAMES.get(split, (split,)))} with "
                            f"{', '.join(SUFFIXES)}); add it or pass a single file")

    def _glue_rows(self, split: str) -> Table:
        name = self.data.split(":", 1)[1]
        try:
            import datasets

            data = datasets.load_dataset("glue", name, split={"train": "train", "eval": "validation"}.get(split, split)
                                         if name != "mnli" else {"train": "train"}.get(split, "validation_matched"))
        except Exception as err:  # noqa: BLE001 - offline or missing package: one message
            raise HeadwiseError(f"could not load GLUE {name} ({str(err).splitlines()[0]}); it needs internet and "
                                "the datasets package, or pass --data FILE") from err
        rows = [dict(row) for row in data]
        return Table(f"{self.data} {split}", rows, list(range(1, len(rows) + 1)))  # where: glue:sst2 train:ROW

    def _check_columns(self, table: Table) -> None:
        columns = list(table.rows[0])
        for flag, column in (("--text-column", self.text_column), ("--label-column", self.label_column)):
            if column not in columns:
                raise HeadwiseError(f"{table.source} has no column {column!r} (columns: "
                                    f"{', '.join(map(str, columns))}); pass {flag} NAME")
        if self.pair_column is not None and self.pair_column not in columns:
            if self._pair_given:
                raise HeadwiseError(f"{table.source} has no column {self.pair_column!r} (columns: "
                                    f"{', '.join(map(str, columns))}); pass --pair-column NAME or leave it out")
            self.pair_column = None
        check_texts(table, self.text_column)
        if self.pair_column is not None:
            check_texts(table, self.pair_column)

    def check(self) -> None:
        """Read and check the train (when there is one) and eval splits: columns, texts, labels, classes (or, for
        regression, gold values a correlation is defined on)."""
        eval_table = self.table("eval")
        if self.is_regression():
            if self.metric == "accuracy":
                self.metric = "spearman"
            check_gold([float(n) for n in self._labels[self.split]], f"classification {eval_table.source}")
        else:
            self.label_names()

    def texts(self, split: str = "calibration") -> list[str]:
        return [str(r[self.text_column]) for r in self.rows(split)]

    def _splits(self) -> list[str]:
        """The splits the label set comes from: train when the data has one, else the evaluated split."""
        return ["train"] if self._table_if_any("train") is not None else [self.split]

    def is_regression(self) -> bool:
        """Float labels: every label a number and one not an integer, or a correlation as the main metric."""
        self.table("eval")
        names = [n for split in {*self._splits(), self.split} for n in self._labels[split]]
        if not all(_number(n) is not None for n in names):
            return False
        return self.metric in ("pearson", "spearman") or any(not float(n).is_integer() for n in names)

    def label_names(self) -> list[str]:
        """Class names in id order, from the training split (eval when there is none): numbers by value (labels
        1/2 are two classes, -1/1 too), others by name. Refuses a single class and an eval label the training
        split lacks, naming its row."""
        if self._classes is None:
            self.table("eval")
            source = self._splits()[0]
            seen = set(self._labels[source])
            numeric = all(_number(n) is not None for n in seen)
            classes = sorted(seen, key=lambda n: (float(n), n) if numeric else (0.0, n))
            table = self._tables[source]
            if len(classes) < 2:
                raise HeadwiseError(f"{table.source}: every label in the {source} split is {classes[0]!r}; a "
                                    "classifier needs at least two classes (add examples of the others)")
            for i, name in enumerate(self._labels[self.split]):
                if name not in seen:
                    raise HeadwiseError(f"{self._tables[self.split].where(i)}: label {name!r} is not among the "
                                        f"{source} split's classes ({', '.join(classes)}); fix the label or add "
                                        "training examples of it")
            self._classes = classes
        return self._classes

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
        names = self._labels[self._name(split)]
        if self.is_regression():
            labels = [float(n) for n in names]
        else:
            index = {name: i for i, name in enumerate(self.label_names())}
            labels = [index[n] for n in names]
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
            finite_outputs(logits, f"classification {self.data}")  # an argmax of NaN is no accuracy
            preds.append(logits[:, 0] if self.is_regression() else logits.argmax(-1))
            gold.append(batch["label"])
        pred, true = torch.cat(preds).cpu().numpy(), torch.cat(gold).cpu().numpy()
        out = correlations(pred, true, f"classification {self.data}") if self.is_regression() else \
            classification_metrics(true, pred, len(self.label_names()))
        return finite_metrics(out | {"examples": len(data), "truncated": data.truncated}, f"classification {self.data}")

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
