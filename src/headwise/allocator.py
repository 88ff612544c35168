"""Hand freed tensor memory back to the operating system at once (Linux, glibc).

glibc's ``malloc`` serves an allocation above its mmap threshold with a fresh mapping, returned on ``free``; below
it, from its heap, which it keeps after ``free``. The threshold starts at 128 KiB and rises to the size of each
mapped block freed (up to 32 MiB), so after a few frees of vocabulary-sized logits or ``[H, T, T]`` attention
maps, every later tensor of that size comes from the heap and stays in the process's memory once freed. At 2,048
tokens on SmolLM2-135M that retained heap was 1.2 GiB of a gradient pass whose saved tensors were under 0.2 GiB
(``benchmarks/scaling.py``). A fixed threshold (``mallopt(M_MMAP_THRESHOLD)``, what ``MALLOC_MMAP_THRESHOLD_``
sets) keeps the peak to what is alive, at the price of fresh (zeroed) pages for each large tensor: at 1 MiB, eval
of a Llama-3.2-1B shape at 512 tokens took 27% longer and ``analyze --task lm`` on SmolLM2 16% longer (separate runs), so it is
opt-in: ``HEADWISE_MMAP_THRESHOLD=1048576`` for the command line, ``return_freed_memory(1 << 20)`` in Python.
Smaller tensors stay on the heap, where freed chunks between live ones keep their pages; ``trim`` returns those
pages where a step's tensors are gone (after a calibration pass; between a KV merge's fits and its install; once
a planned edit is built, around its latency base and once it is undone).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Any

from .errors import HeadwiseError

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MAX_THRESHOLD = 32 << 20  # glibc's largest mmap threshold on 64-bit systems
ENV = "HEADWISE_MMAP_THRESHOLD"


def return_freed_memory(threshold: int | None = None) -> bool:
    """Serve allocations of at least ``threshold`` bytes (default: ``$HEADWISE_MMAP_THRESHOLD``, else 0; 0 leaves
    glibc's own) with their own mappings, so that freeing them returns the memory. Returns True when the setting
    took effect (glibc), False where there is no glibc or 0 was asked."""
    if threshold is None:
        raw = os.environ.get(ENV, "0")
        try:
            threshold = int(raw)
        except ValueError:
            raise HeadwiseError(f"${ENV}={raw!r} is not a number of bytes (0 keeps glibc's default)") from None
    if not 0 <= threshold <= MAX_THRESHOLD:
        raise HeadwiseError(f"mmap threshold {threshold} bytes: give 0 (glibc's default) to {MAX_THRESHOLD} (32 MiB)")
    if threshold == 0:
        return False
    mallopt = _glibc("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, threshold))


def trim() -> bool:
    """Give the heap's free pages back to the system now (glibc's ``malloc_trim(0)``: the pages of free chunks
    anywhere in the heap, not only at its top). For the end of a step whose small tensors are all freed, so that
    the next step's peak is its own and not the last one's leftovers.
    Returns whether it ran (False without glibc)."""
    malloc_trim = _glibc("malloc_trim")
    if malloc_trim is None:
        return False
    malloc_trim.argtypes, malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    malloc_trim(0)
    return True


def _glibc(function: str) -> Any:
    """The C library's ``function``, or None where there is no such C library function (macOS, musl)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return getattr(ctypes.CDLL(name), function)
    except (OSError, AttributeError):
        return None
