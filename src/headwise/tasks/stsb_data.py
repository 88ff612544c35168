"""Finding and reading the STS Benchmark files (``sts-train.tsv``, ``sts-dev.tsv``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import HeadwiseError
from ..io.files import read_text
from .paths import PACKAGED_DATA, data_roots

SPLITS = {"train": "sts-train.tsv", "dev": "sts-dev.tsv", "test": "sts-test.tsv"}
ENV = "HEADWISE_STSB_DIR"
SCORE_RANGE = 5.0  # gold similarity runs from 0 to 5


@dataclass(frozen=True)
class StsbPairs:
    first: list[str]
    second: list[str]
    scores: list[float]  # gold similarity, 0-5

    def __len__(self) -> int:
        return len(self.scores)

    def sentences(self) -> list[str]:
        """Every distinct sentence once, in first-seen order."""
        return list(dict.fromkeys(self.first + self.second))


def _candidates() -> list[Path]:
    """``$HEADWISE_STSB_DIR``, then ``stsb`` under every data root (``$HEADWISE_DATA_DIR``, ``shared/data`` above),
    then the copy shipped in the package (train and dev)."""
    found = [Path(os.environ[ENV])] if os.environ.get(ENV) else []
    return found + [root / "stsb" for root in data_roots()] + [PACKAGED_DATA / "stsb"]


def stsb_file(split: str = "dev", data: str | os.PathLike | None = None) -> Path:
    """The file of ``split``. ``data`` is the file itself or its folder; by default ``$HEADWISE_STSB_DIR``, then
    ``$HEADWISE_DATA_DIR/stsb``, then ``shared/data/stsb`` in the working directory or any parent, then the train and
    dev splits shipped in the package."""
    if split not in SPLITS:
        raise HeadwiseError(f"unknown STS-B split {split!r}; use one of {', '.join(SPLITS)}")
    if data is not None:
        path = Path(data)
        path = path / SPLITS[split] if path.is_dir() else path
        if not path.is_file():
            raise HeadwiseError(f"STS-B file not found: {path} (expected the tab-separated {SPLITS[split]})")
        return path
    for folder in _candidates():
        if (folder / SPLITS[split]).is_file():
            return folder / SPLITS[split]
    raise HeadwiseError(
        f"STS-B {split} split not found: no {SPLITS[split]} in ${ENV}, in $HEADWISE_DATA_DIR/stsb, in shared/data/stsb "
        "above the working directory or in the package (it ships train and dev). Pass --data PATH to the file or its "
        "folder (STS Benchmark, Stsbenchmark.tar.gz from ixa2.si.ehu.eus/stswiki)"
    )


def read_stsb(split: str = "dev", data: str | os.PathLike | None = None) -> StsbPairs:
    """Sentence pairs and gold scores: columns 5-7 (score, sentence 1, sentence 2) of the STS-B tsv. Refuses, naming
    the line, a score that is not a number from 0 to 5 and an empty sentence."""
    path = stsb_file(split, data)
    first, second, scores = [], [], []
    for number, line in enumerate(read_text(path).splitlines(), 1):
        cols = line.split("\t")
        if len(cols) < 7:
            raise HeadwiseError(f"{path}:{number}: expected at least 7 tab-separated columns, got {len(cols)}")
        try:
            score = float(cols[4])
        except ValueError:
            raise HeadwiseError(f"{path}:{number}: score {cols[4]!r} is not a number; fix or remove the line") from None
        if not 0.0 <= score <= SCORE_RANGE:  # NaN fails too
            raise HeadwiseError(f"{path}:{number}: score {cols[4]!r} is not a number from 0 to {SCORE_RANGE:g}; fix "
                                "or remove the line")
        for column in (5, 6):
            if not cols[column].strip():
                raise HeadwiseError(f"{path}:{number}: sentence {column - 4} (column {column + 1}) is empty; fix or "
                                    "remove the line")
        scores.append(score)
        first.append(cols[5])
        second.append(cols[6])
    if not scores:
        raise HeadwiseError(f"{path} holds no sentence pairs")
    return StsbPairs(first, second, scores)
