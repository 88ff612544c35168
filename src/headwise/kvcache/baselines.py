"""The simpler ways to spend a KV budget, beside the headwise policy, at the same bytes: what a per-head policy is
compared against (``experiments/kv_long_suite.py``, the long-context suite's arms).

For a budget ``b`` at ``context`` tokens (every streaming window scaled with the sequence, as ``kv_policy`` does):

- ``policy``: ``kv_policy`` — the top-ranked KV heads full (by ``scores``), the others sink + window;
- ``random``: as many full heads with the same window, chosen by a seeded shuffle;
- ``layer``: whole layers full or sink + window, ranked by their best-ranked KV head, as many as fit the budget
  with the same window (coarser: at most one layer's bytes below the budget);
- ``streaming``: every KV head sink + window with ``sink + window = b · context`` (StreamingLLM).

Each is a ``KVPolicy``; the bytes a cache really holds are measured where it runs (``PolicyCache.stored_bytes``).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..errors import HeadwiseError
from .choose import DEFAULT_RANKING, default_window, kv_policy
from .policy import KVPolicy, streaming
from .scores import HeadScores

BASELINES = ("policy", "streaming", "random", "layer")


def streaming_policy(model: nn.Module, kv_budget: float, context: int, sink: int = 4) -> KVPolicy:
    """Every KV head sink + window holding ``kv_budget`` of a ``context``-token cache (the window scales with the
    sequence)."""
    window = int(kv_budget * context) - sink
    if window < 1:
        raise HeadwiseError(f"kv_budget={kv_budget} at {context} tokens leaves no window after {sink} sink tokens")
    return KVPolicy.uniform(model, streaming(sink, window, context))


def equal_bytes_policies(model: nn.Module, tokenizer: Any, kv_budget: float, scores: HeadScores, context: int = 2048,
                         sink: int = 4, ranking: str = DEFAULT_RANKING, seed: int = 0,
                         arms: tuple[str, ...] = BASELINES, window: int | None = None) -> dict[str, KVPolicy]:
    """``{arm: KVPolicy}`` of ``arms`` (``BASELINES``, see the module docstring) for ``kv_budget`` at ``context``
    tokens; ``scores`` ranks the heads of ``policy`` and ``layer`` (``head_scores``, computed once for every
    budget). ``window``: the streaming heads' window of ``policy``, ``random`` and ``layer`` (default
    ``default_window``); StreamingLLM's fills the budget."""
    unknown = [a for a in arms if a not in BASELINES]
    if unknown:
        raise HeadwiseError(f"unknown arms {unknown}; choose from {', '.join(BASELINES)}")
    window = default_window(kv_budget, context, sink) if window is None else window
    common = {"kv_budget": kv_budget, "context": context, "sink": sink, "window": window, "progress": False}
    make = {"policy": lambda: kv_policy(model, tokenizer, ranking=ranking, scores=scores, **common)[0],
            "random": lambda: kv_policy(model, tokenizer, ranking="random", seed=seed, **common)[0],
            "layer": lambda: kv_policy(model, tokenizer, ranking=ranking, scores=scores, granularity="layer",
                                       **common)[0],
            "streaming": lambda: streaming_policy(model, kv_budget, context, sink)}
    return {arm: make[arm]() for arm in arms}
