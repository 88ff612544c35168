"""Pareto fronts: points no other point beats on the score and on every cost axis at once."""

from __future__ import annotations

from typing import Sequence


def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    """``a`` is at least as good as ``b`` everywhere and better somewhere (all objectives minimised)."""
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))


def front(vectors: Sequence[Sequence[float]]) -> list[int]:
    """Indices of the non-dominated vectors (objectives minimised; exact duplicates all stay)."""
    return [i for i, v in enumerate(vectors) if not any(dominates(w, v) for j, w in enumerate(vectors) if j != i)]
