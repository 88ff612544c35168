"""Batch-row operations of a cache layer that holds its tensors batch-first (``[B, ...]``): beam search and
batch expansion only need a way to map every held tensor (``_each(fn)``)."""

from __future__ import annotations

from typing import Callable

import torch


class RowOps:
    """Mixin for cache layers: ``reorder_cache`` / ``batch_repeat_interleave`` / ``batch_select_indices`` over
    every tensor the layer's ``_each(fn)`` visits (``fn: [B, ...] -> [B', ...]``)."""

    def _each(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        raise NotImplementedError

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._each(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._each(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._each(lambda t: t[indices])
