"""Progress of long steps, one helper for every loop: a tqdm bar on a terminal; in a log (stderr is not a terminal)
one plain line at most every ``$HEADWISE_PROGRESS_INTERVAL`` seconds (default 30), with the count, the rate and the
time left, and nothing at all for steps shorter than that."""

from __future__ import annotations

import io
import os
import sys
from typing import Any, Iterable, TextIO

from tqdm.auto import tqdm

from .errors import HeadwiseError

INTERVAL_ENV = "HEADWISE_PROGRESS_INTERVAL"
DEFAULT_INTERVAL = 30.0
LOG_FORMAT = ("{desc}: {n_fmt}/{total_fmt} {unit} ({percentage:.0f}%), {elapsed} elapsed, {remaining} left, "
              "{rate_fmt}{postfix}")
LOG_FORMAT_OPEN = "{desc}: {n_fmt} {unit}, {elapsed} elapsed, {rate_fmt}{postfix}"  # postfix: ", what" if the loop sets it  # no total known: no time left either


class _Lines(io.TextIOBase):
    """What tqdm writes, as whole lines: its carriage-return redraws become one ``headwise: ...`` line each."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.last = ""

    def write(self, text: str) -> int:
        line = text.replace("\r", "").strip()
        count = line.split(",")[0]  # "step: n/N unit (p%)"; closing the bar redraws the last count: once is enough
        if line and count != self.last:
            self.stream.write(f"headwise: {line}\n")
            self.stream.flush()
            self.last = count
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def log_interval() -> float:
    """Seconds between progress lines in a log (``$HEADWISE_PROGRESS_INTERVAL``, default 30)."""
    raw = os.environ.get(INTERVAL_ENV, "")
    if not raw:
        return DEFAULT_INTERVAL
    try:
        seconds = float(raw)
    except ValueError:
        raise HeadwiseError(f"${INTERVAL_ENV}={raw!r} is not a number of seconds; unset it or give e.g. 30") from None
    if seconds < 0:
        raise HeadwiseError(f"${INTERVAL_ENV}={raw!r} must be ≥ 0 seconds")
    return seconds


def progress_bar(iterable: Iterable | None = None, *, disable: bool | None = None, **options: Any) -> tqdm:
    """``tqdm(iterable, **options)`` that also reports into logs. ``disable``: True shows nothing; None (default)
    and False show a bar on a terminal and periodic lines otherwise (False: also for steps shorter than the
    interval)."""
    if disable:
        return tqdm(iterable, disable=True, **options)
    stream = sys.stderr
    if stream.isatty():
        return tqdm(iterable, disable=False, file=stream, **options)
    every = log_interval()
    total = options.get("total", len(iterable) if hasattr(iterable, "__len__") else None)
    options.setdefault("unit", "it")
    return tqdm(iterable, disable=False, file=_Lines(stream), mininterval=every, miniters=1, ascii=True,
                delay=0 if disable is False else every,
                bar_format=LOG_FORMAT if total else LOG_FORMAT_OPEN, **options)
