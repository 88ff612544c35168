"""Observers: per-site callables that turn each batch's attention maps into accumulated sums.

The driver (``analyze``) fills a ``BatchContext`` before each forward; the runtime then calls every site's
observer with ``probs[B, H, T, T]``, ``keep[B|1, 1|H, T, T] | None`` and ``out[B, T, H, d]`` — or, as both observers
take rows (``takes_rows``) and nothing else needs the maps, with a ``runtime.probs.ProbRows`` and ``keep=None``: the
attention then runs through SDPA and the statistics read the probabilities chunk by chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..sites import AttentionSite
from ..runtime.gates import layer_of
from ..runtime.probs import ProbRows
from .metrics import LayerSums, histogram_edges
from .stats import HeadStats


@dataclass
class BatchContext:
    """What observers need to know about the batch in flight: ``real`` and ``special`` token masks ``[B, T]``, and
    whether its forward is still running (``done()``: a backward's recomputation of the blocks is not observed)."""

    real: torch.Tensor | None = None
    special: torch.Tensor | None = None
    observing: bool = False

    def set(self, real: torch.Tensor, special: torch.Tensor) -> None:
        self.real, self.special = real.bool(), special.bool() & real.bool()
        self.observing = True

    def done(self) -> None:
        self.observing = False


class StatsObserver:
    """Adds the statistics of every layer into ``stats`` at row ``first_row + layer``.

    A call holds a whole layer (``probs[B, H, T, T]``) or, when the layer runs over chunks of positions
    (``layer_stack.chunked_layers``), one chunk's query rows against the keys so far (``[B, H, n, Tk]``: the
    queries are the last ``n`` of the ``Tk`` keys); the layer's sums (``metrics.LayerSums``) are added once its last
    row is in."""

    takes_rows = True

    def __init__(self, stats: HeadStats, context: BatchContext, first_row: int, n_layers: int) -> None:
        self.stats, self.context = stats, context
        self.first_row, self.n_layers = first_row, n_layers
        self.edges = histogram_edges()
        self.calls = 0
        self.layer: tuple[int, LayerSums] | None = None  # the row and sums of a layer whose chunks are coming in

    @property
    def active(self) -> bool:
        """False once the batch's forward is done (``BatchContext.done``): the runtime then skips the observer, and a
        backward's recomputation of a block runs SDPA as its forward did (the observer takes rows), keeping no
        probabilities for the block's backward."""
        return self.context.real is None or self.context.observing

    def __call__(self, probs: torch.Tensor | ProbRows, keep: torch.Tensor | None, out: torch.Tensor) -> None:
        ctx = self.context
        B, H, n, Tk = probs.shape
        if ctx.real is None or ctx.real.shape[0] != B or not n <= Tk <= ctx.real.shape[1]:
            raise RuntimeError("analysis observer called without a matching BatchContext (set it before forward)")
        q0 = Tk - n
        if q0 == 0 and self.layer is not None:
            raise RuntimeError(f"analysis observer: a layer's statistics stopped at query row {self.layer[1].rows} "
                               f"of {ctx.real.shape[1]} (a forward shorter than its BatchContext?)")
        if q0 == 0:
            self.layer = (self.first_row + layer_of(self, self.n_layers),
                          LayerSums(ctx.real, ctx.special, H, self.stats.thresholds, self.edges))
        elif self.layer is None:
            raise RuntimeError(f"analysis observer: query rows {q0}:{Tk} came before the layer's first rows")
        row, sums = self.layer
        sums.add(probs, keep, out, q0)
        if Tk == ctx.real.shape[1]:
            self.layer = None
            self.stats.add_(row, sums.finish())


@dataclass
class MapRecorder:
    """Keeps the full maps of a one-sentence, unpadded forward: ``maps[row] = probs[0]`` (``[H, T, T]``)."""

    first_row: int
    n_layers: int
    maps: dict[int, torch.Tensor] = field(default_factory=dict)
    calls: int = 0

    @classmethod
    def build(cls, maps: dict[int, torch.Tensor]):
        def make(site: AttentionSite, first_row: int, n_layers: int) -> "MapRecorder":
            return cls(first_row, n_layers, maps)
        return make

    takes_rows = True

    def __call__(self, probs: torch.Tensor | ProbRows, keep: torch.Tensor | None, out: torch.Tensor) -> None:
        full = probs.full() if isinstance(probs, ProbRows) else probs
        self.maps[self.first_row + layer_of(self, self.n_layers)] = full[0].detach().float().cpu()
