"""Shared helpers for benchmarks: interleaved timing and writing results into docs/benchmarks.md."""

from __future__ import annotations

import platform
import re
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

from headwise.io import atomic_write_text

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def interleaved(fns: dict[str, Callable[[], object]], repeats: int = 7, warmup: int = 2) -> dict[str, list[float]]:
    """Time each function ``repeats`` times, round-robin (A, B, A, B, ...), so machine noise hits all alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def cpu_name() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else the platform's processor or machine string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    return f"{cpu_name()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}"


def update_section(name: str, markdown: str, doc: Path = DOC) -> None:
    """Replace (or append) the section between ``<!-- bench:name -->`` markers in ``doc`` (docs/benchmarks.md)."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{start}\n{markdown.strip()}\n{end}"
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    atomic_write_text(doc, text)
