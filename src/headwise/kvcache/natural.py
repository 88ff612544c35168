"""Natural text every Python install has, for the ``outside`` score's default calibration (issue 68): the prose of
Python's documentation (``pydoc_data.topics``, its topics in sorted order) and the source of a fixed list of
standard-library modules (``CODE_MODULES``), both under the PSF License. The long-context suite's ``docs`` and
``code`` haystacks read the same text (``tasks.haystacks``); its ``prose`` haystack, the family the default policy is
judged on, is never calibrated on."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from typing import Any

from ..errors import HeadwiseError

# modules of every CPython since 3.9 whose source is plain, long and stable; read in this order
CODE_MODULES = ("argparse", "calendar", "dataclasses", "difflib", "fractions", "heapq", "statistics", "textwrap",
                "shutil", "string", "json.decoder", "tarfile")
SOURCES = {
    "docs": "Python's documentation topics (pydoc_data.topics), PSF License",
    "code": "Python standard-library source (" + ", ".join(CODE_MODULES) + "), PSF License",
}
CALIBRATION_SOURCES = ("docs", "code")  # the default calibration text of ``outside``: never the judged prose


def source_text(name: str) -> str:
    """The whole text of the source ``name`` (``docs`` or ``code``, see ``SOURCES``), read from this interpreter."""
    if name == "docs":
        import pydoc_data.topics

        topics = pydoc_data.topics.topics
        return "\n".join(topics[k] for k in sorted(topics))
    if name == "code":
        return "\n".join(Path(importlib.util.find_spec(m).origin).read_text(encoding="utf-8") for m in CODE_MODULES)
    raise HeadwiseError(f"unknown natural-text source {name!r}; use one of {', '.join(SOURCES)}")


def source_version() -> str:
    """The Python version the sources are read from (``3.12``)."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def natural_texts(tokenizer: Any, length: int, per_source: int = 2, sources: tuple[str, ...] = CALIBRATION_SOURCES,
                  seed: int = 0) -> list[str]:
    """``per_source`` passages of at least ``length`` tokens from each of ``sources``, each starting at a seeded
    line of the source's text (wrapped around at its end); ``per_source × len(sources)`` strings, in source order."""
    texts = []
    for name in sources:
        text = source_text(name)
        starts = [i + 1 for i, c in enumerate(text) if c == "\n"]
        rng = random.Random(f"natural/{name}/{seed}")
        for _ in range(per_source):
            at, size = rng.choice(starts), 6 * length
            while True:
                passage = (text[at:] + "\n" + text)[:size]
                if len(tokenizer(passage, add_special_tokens=False)["input_ids"]) >= length or size > len(text):
                    break
                size *= 2
            texts.append(passage)
    return texts
