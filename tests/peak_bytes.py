"""The most bytes of CPU tensors a call held at once, from the profiler's allocation events (no timing, no RSS)."""

from __future__ import annotations

from typing import Callable

from torch.profiler import ProfilerActivity, profile


def peak_tensor_bytes(fn: Callable[[], object]) -> int:
    """The most bytes ``fn``'s CPU tensors held at once (allocations and frees, in the profiler's order)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    held = peak = 0
    for _, size in events:
        held += size
        peak = max(peak, held)
    return peak
