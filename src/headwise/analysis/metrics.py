"""Per-head attention statistics of one batch, returned as *sums* so that merging batches is addition.

Notation (one attention site, one layer, one batch):

- ``A = probs[B, H, T, T]``: post-softmax, pre-dropout probabilities (queries × keys);
- ``real[B, T]``: real (non-padding) tokens; ``special[B, T]``: special tokens ([CLS], [SEP], BOS...) among them;
- ``keep[B|1, 1|H, T, T]``: the runtime's "may attend" mask (None: all visible), which already hides future
  keys in causal models;
- valid entries ``V = keep ∧ real_i ∧ real_j``; valid query rows are the real positions ``i``.

Every per-head metric is a mean over valid query rows of a per-row value computed on the valid entries of the
row (entries outside ``V`` count as 0; no renormalisation), except the ``mhr_*`` ones, which are per-sentence
means, and ``sparsity@t``, a ratio of entry counts. Exact definitions are in ``METRIC_INFO``. Differences from
the reference code (docs/reference-methods.md):

- ``mhr_base``/``mhr_advanced`` (B.4) use only the valid block and do not zero the last query → last key entry
  (fairseq's EOS); ``mhr_advanced`` divides by the number of real keys ``n`` rather than ``Tk − 1``.
- ``confidence_no_special`` (A.7) drops special tokens both as queries and as keys, without renormalising.
- ``sparsity@t`` (C.2) counts valid entries ``≤ t`` over all valid entries; for encoders that is SPIQA's
  ``n × n`` block, for causal models its lower triangle.
- The histogram (C.3): per valid query row, the row's valid entries (``+1e-8``) are binned and the row's
  counts normalised to sum 1; rows are summed and each head normalised at the end. Values above the last edge
  (``1 + 1e-8``) count in the last bin.
- Similarity (B.6): plain cosine in ``[-1, 1]`` (not ``1 + cos``) and L2, between heads' flattened valid
  attention blocks and between their outputs Z over real positions; per sentence, then averaged over sentences.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator

import torch
import torch.nn.functional as F

from ..runtime.probs import ProbRows

HIST_BINS = 100
HIST_OFFSET = 1e-8  # added to every weight before binning so that zeros land in the first bin (SPIQA, C.3)
ROW_METRICS = ("confidence", "entropy", "distance", "special", "self", "prev", "next")
SENTENCE_METRICS = ("mhr_base", "mhr_advanced")
SIMILARITIES = ("attention_cosine", "attention_l2", "output_cosine", "output_l2")


def histogram_edges() -> torch.Tensor:
    """The 101 log-spaced bin edges ``10^linspace(-8, 0, 101)``, first edge nudged down by ``1e-9`` (C.3)."""
    edges = 10.0 ** torch.linspace(-8.0, 0.0, HIST_BINS + 1, dtype=torch.float64)
    edges[0] -= 1e-9
    return edges


OUTSIDE = 2.0  # marks an entry outside the valid block: above every probability, binned in ``HIST_BINS`` (dropped)


@lru_cache(maxsize=4)
def _bin_tables(edges: tuple[float, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Lookup tables ``(first [65536] uint8, cut [65536] int32)`` that bin float32 weights exactly as
    ``bucketize(float64(a) + HIST_OFFSET, edges[1:-1], right=True)``, without the float64 copy and the binary
    search: with ``c = (bits(a) >> 16) + 32768`` (the top 16 bits of its bit pattern, as a table index), ``a``
    lies in bin ``first[c] + (bits(a) >= cut[c])``. Bit patterns of non-negative floats are ordered as the
    floats, so bin ``k`` starts at the bit pattern of the smallest float32 ``a`` with
    ``float64(a) + HIST_OFFSET >= edges[k]``; a 16-bit cell spans a factor below ``2^(1/128)``, the edges a
    factor ``10^0.08``, so no cell holds two bin starts. Negative weights (negative bit patterns) fall in bin 0,
    as ``a + HIST_OFFSET`` is below the first edge; ``OUTSIDE`` and above (and NaN) in bin ``HIST_BINS``."""
    inner = torch.tensor(edges[1:-1], dtype=torch.float64)
    start = (inner - HIST_OFFSET).float()
    up, down = torch.tensor(float("inf")), torch.tensor(float("-inf"))
    for _ in range(16):  # a few float32 steps from the rounded guess to the exact smallest qualifying value
        fits = start.double() + HIST_OFFSET >= inner
        lower = torch.nextafter(start, down)
        start = torch.where(~fits, torch.nextafter(start, up),
                            torch.where(lower.double() + HIST_OFFSET >= inner, lower, start))
    fits = start.double() + HIST_OFFSET >= inner
    below = torch.nextafter(start, down).double() + HIST_OFFSET >= inner
    if not fits.all() or below.any():
        raise RuntimeError("histogram bin starts did not converge")
    starts = start.view(torch.int32).long()  # [bins - 1], increasing, positive
    high = torch.arange(-32768, 32768, dtype=torch.long)  # the top 16 bits of each cell, signed
    low = torch.where(high >= 0, high << 16, torch.full_like(high, -1))  # first bit pattern of each cell
    first = torch.searchsorted(starts, low, right=True)  # bin starts at or below the cell's first pattern
    cell = (starts >> 16) + 32768  # the cell holding each bin start
    if cell.unique().numel() != cell.numel():
        raise RuntimeError("two histogram bins start in one 16-bit cell")
    inside = starts > low[cell]  # the start lies past its cell's first pattern: a cut inside the cell
    cut = torch.full_like(high, torch.iinfo(torch.int32).max)
    cut[cell[inside]] = starts[inside]
    outside = (torch.tensor(OUTSIDE, dtype=torch.float32).view(torch.int32).long() >> 16) + 32768
    first[outside:], cut[outside:] = HIST_BINS, torch.iinfo(torch.int32).max
    return first.to(torch.uint8), cut.int()


def histogram_bins(probs: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    """``bucketize(probs.double() + HIST_OFFSET, edges[1:-1], right=True)`` as uint8, ``probs``' shape, for
    float32 ``probs``, by table lookup (``_bin_tables``); entries ``≥ OUTSIDE`` get ``HIST_BINS``. Temporaries:
    9 bytes per entry (the cell index, the cut and the bin)."""
    first, cut = _bin_tables(tuple(edges.tolist()))
    first, cut = first.to(probs.device), cut.to(probs.device)
    bits = probs.float().contiguous().view(torch.int32).flatten()
    cell = bits >> 16
    cell += 32768
    bins = first.index_select(0, cell)
    bins += bits >= cut.index_select(0, cell)
    return bins.view(probs.shape)


def sparsity_name(t: float) -> str:
    """``sparsity@0.001`` for ``t = 1e-3`` (``sparsity@0.0001`` for ``1e-4``)."""
    return f"sparsity@{t:g}"


def _info(label: str, description: str, lo: float | None, hi: float | None, higher: str | None) -> dict:
    return {"label": label, "description": description, "range": None if lo is None else [lo, hi], "higher": higher}


METRIC_INFO: dict[str, dict] = {
    "confidence": _info(
        "confidence", "Mean over real query tokens of the largest attention weight of the row (Voita et al.).",
        0.0, 1.0, "specialised"),
    "confidence_no_special": _info(
        "confidence (no special)", "Mean over real non-special query tokens of the largest weight given to a "
        "non-special key; weights are not renormalised after dropping special keys.", 0.0, 1.0, "specialised"),
    "mhr_base": _info(
        "MHR base", "Mean over sentences of the largest weight of the sentence's valid attention block (MHR 'base').",
        0.0, 1.0, "specialised"),
    "mhr_advanced": _info(
        "MHR advanced", "Mean over sentences of the mean over real keys of the largest weight any real query gives "
        "that key (MHR 'advanced', divided by the number of real keys).", 0.0, 1.0, "specialised"),
    "entropy": _info("entropy", "Mean over real query tokens of the row entropy -sum A log A in nats (0 log 0 = 0).",
                     None, None, None),
    "distance": _info(
        "distance", "Mean over real query tokens of the expected token distance sum_j A_ij |i - j|.", None, None, None),
    "special": _info(
        "special", "Mean over real query tokens of the attention mass on special tokens ([CLS], [SEP], BOS, ...).",
        0.0, 1.0, None),
    "self": _info("self", "Mean over real query tokens of the weight on the token itself (j = i).",
                  0.0, 1.0, "specialised"),
    "prev": _info("previous", "Mean over real query tokens of the weight on the previous token (j = i - 1).",
                  0.0, 1.0, "specialised"),
    "next": _info("next", "Mean over real query tokens of the weight on the next token (j = i + 1).",
                  0.0, 1.0, "specialised"),
    "importance_gradient": _info(
        "gradient importance", "Michel et al. head importance E|dL/dg_h| at gates g = 1, each row divided by its "
        "L2 norm.", 0.0, 1.0, "important"),
    "importance_ablation": _info(
        "ablation importance", "Drop of the metric when the head alone is zeroed; by default 1 - mean cosine "
        "between pooled embeddings with and without the head.", None, None, "important"),
}


def sparsity_info(t: float) -> dict:
    return _info(f"sparsity ≤ {t:g}", f"Fraction of valid attention entries (query and key real, key visible) "
                 f"whose weight is ≤ {t:g}, pooled over all sentences (SPIQA).", 0.0, 1.0, None)


def _pairwise(gram: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine and L2 between the rows behind ``gram[B, H, H]`` (their float64 inner products) → two ``[B, H, H]``
    (cosine 0 for zero rows)."""
    sq = gram.diagonal(0, 1, 2)
    norms = sq.clamp(min=0).sqrt()
    cos = gram / (norms[:, :, None] * norms[:, None, :]).clamp(min=1e-300)
    l2 = (sq[:, :, None] + sq[:, None, :] - 2 * gram).clamp(min=0).sqrt()
    return cos, l2


def _gram(x: torch.Tensor) -> torch.Tensor:
    """``x[B, H, N]`` → ``[B, H, H]`` float64 inner products between the heads' rows."""
    x = x.double()
    return x @ x.transpose(1, 2)


ENTRY_BYTES = 16  # peak bytes of ``batch_sums``' temporaries per attention entry of a block (tested)
ROW_BYTES = 16 * (HIST_BINS + 1)  # and per query row and head: its histogram counts, as integers then floats
CPU_BLOCK_BYTES = 32 << 20  # a block's temporaries on a CPU: cache-sized, a small fixed margin at any length
ACCELERATOR_BLOCK_BYTES = 1 << 30  # the most on an accelerator, where larger blocks mean fewer launches


def block_bytes(device: torch.device) -> int:
    """What the temporaries of one block of query rows may take on ``device``: ``CPU_BLOCK_BYTES`` on a CPU (or
    ``meta``); on an accelerator a sixteenth of its free memory, between ``CPU_BLOCK_BYTES`` and
    ``ACCELERATOR_BLOCK_BYTES``."""
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
        return int(min(ACCELERATOR_BLOCK_BYTES, max(CPU_BLOCK_BYTES, free // 16)))
    return CPU_BLOCK_BYTES


def block_rows(batch: int, heads: int, keys: int, device: torch.device) -> int:
    """Query rows per block (at least 1) so that a block's temporaries (``ENTRY_BYTES`` per entry of
    ``batch × heads × rows × keys``, ``ROW_BYTES`` per row and head) stay within ``block_bytes(device)``,
    whatever the length."""
    return max(1, block_bytes(device) // (max(1, batch * heads) * (ENTRY_BYTES * keys + ROW_BYTES)))


def _key_end(keep: torch.Tensor | None, keys: int) -> int:
    """One past the last key ``keep[..., n, Tk]`` lets any row see (``keys`` when None; at least 1)."""
    if keep is None:
        return keys
    seen = keep.reshape(-1, keep.shape[-1]).any(0).nonzero()
    return max(1, int(seen[-1]) + 1) if len(seen) else 1


def query_blocks(probs: torch.Tensor | ProbRows, keep: torch.Tensor | None, diagonal: bool = False, offset: int = 0
                 ) -> Iterator[tuple[int, int, torch.Tensor, torch.Tensor | None]]:
    """The maps by blocks of query rows: ``(q0, q1, A[B, H, q1 − q0, k1] float32, keep[B|1, 1|H, q1 − q0, k1] |
    None)``, ``block_rows`` rows at a time (each row whole: its softmax needs no other block). Keys past
    ``k1`` are seen by none of the block's rows (a causal block ``q0:q1`` stops at key ``q1``), hence have no
    weight and are left out; ``diagonal`` keeps at least the keys up to ``offset + q1`` (``A[i, i + 1]`` exists),
    where ``offset`` is the position of the map's first query row among the keys (a chunk of a layer's queries).
    ``A`` is the block's own tensor (never a view of ``probs``): callers may change it in place."""
    B, H, Tq, Tk = probs.shape
    step = block_rows(B, H, Tk, probs.device)
    for q0 in range(0, Tq, step):
        q1 = min(Tq, q0 + step)
        lazy = isinstance(probs, ProbRows)
        k1 = probs.key_end(q0, q1) if lazy else _key_end(None if keep is None else keep[:, :, q0:q1], Tk)
        if diagonal:
            k1 = max(k1, min(Tk, offset + q1 + 1))
        if lazy:
            yield q0, q1, probs.rows(q0, q1, k1).float(), probs.keep(q0, q1, k1)
        else:
            A = probs[:, :, q0:q1, :k1]
            yield q0, q1, A.float() if A.dtype != torch.float32 else A.clone(), \
                None if keep is None else keep[:, :, q0:q1, :k1]


def _output_gram(out: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """``_gram`` of the heads' outputs over real positions, ``out[B, n, H, d]`` with ``real[B, n]`` → ``[B, H, H]``,
    summed over blocks of positions (each a float64 copy of at most ``block_bytes``)."""
    B, T, H, d = out.shape
    step = max(1, block_bytes(out.device) // (16 * B * H * d))  # two float32 copies and a float64 one per value
    gram = torch.zeros(B, H, H, dtype=torch.float64, device=out.device)
    for t0 in range(0, T, step):
        z = out[:, t0 : t0 + step].float() * real[:, t0 : t0 + step, None, None]
        gram += _gram(z.transpose(1, 2).flatten(2))  # [B, H, n·d]
    return gram


def _add_block(sums: dict[str, torch.Tensor], acc: dict[str, torch.Tensor], q0: int, q1: int, Av: torch.Tensor,
               keep: torch.Tensor | None, real: torch.Tensor, special: torch.Tensor, plain: torch.Tensor,
               thresholds: tuple[float, ...], edges: torch.Tensor) -> None:
    """Add the block ``Av[B, H, n, k]`` (query rows ``q0:q1``, keys ``:k``; changed in place) with its mask
    ``keep[B|1, 1|H, n, k]`` into ``batch_sums``' per-head ``sums`` and its accumulators ``acc`` (its temporaries
    end with the call)."""
    B, H, n, k = Av.shape
    q = slice(q0, q1)
    valid = real[:, None, q, None] & real[:, None, None, :k]  # [B, 1|H, n, k]: not expanded over heads
    if keep is not None:
        valid = valid & keep.bool()
    invalid = ~valid
    Av.masked_fill_(invalid, 0.0)  # the valid entries' weights, 0 elsewhere
    rows = real[:, None, q].to(Av.dtype)  # [B, 1, n]
    pos = torch.arange(max(q1, k), device=Av.device)
    distance = (pos[q, None] - pos[None, :k]).abs().to(Av.dtype)
    diagonal = lambda offset: Av.diagonal(q0 + offset, -2, -1)  # noqa: E731  [B, H, ≤ n]: A[i, i + offset]
    prev, nxt = diagonal(-1), diagonal(1)
    per_row = {
        "confidence": Av.amax(-1),
        "entropy": torch.special.entr(Av).sum(-1),
        "distance": (Av * distance).sum(-1),
        "self": diagonal(0),
        "prev": F.pad(prev, (n - prev.shape[-1], 0)),  # row 0 has no previous token
        "next": F.pad(nxt, (0, n - nxt.shape[-1])),  # row T − 1 has no next token
    }
    # special keys are few (BOS, CLS, SEP): their columns alone give the mass on them and, set to 0 for a moment,
    # the largest weight on the others
    columns = special[:, :k].any(0).nonzero().flatten()  # keys special in some sentence
    held = Av[..., columns]  # [B, H, n, c] (a copy)
    mine = special[:, None, None, columns]  # [B, 1, 1, c]
    per_row["special"] = (held * mine).sum(-1)
    Av[..., columns] = held.masked_fill(mine, 0.0)
    no_special = Av.amax(-1)
    Av[..., columns] = held
    for name, value in per_row.items():
        sums[name] += (value * rows).sum((0, 2)).double()
    sums["confidence_no_special"] += (no_special * plain[:, None, q]).sum((0, 2)).double()
    torch.maximum(acc["block_max"], Av.amax((-2, -1)), out=acc["block_max"])
    column_max = acc["column_max"][..., :k]
    torch.maximum(column_max, Av.amax(-2), out=column_max)

    row_entries = valid.sum(-1, dtype=torch.int32).expand(B, H, n)  # valid keys of each query row
    block_entries = row_entries.sum((0, 2), dtype=torch.int64)  # [H]
    acc["entries"] += block_entries
    # invalid entries are 0 in Av, hence ≤ every threshold (thresholds lie in [0, 1]): count all, take them off
    for j, t in enumerate(thresholds):
        acc["below"][j] += (Av <= t).sum(-1, dtype=torch.int32).sum((0, 2)) - (B * n * k - block_entries)

    # each valid row adds 1 spread over its entries' bins: its entries counted per bin (invalid ones in the dropped
    # bin HIST_BINS), each row's counts divided by its valid count
    bins = histogram_bins(Av, edges)  # [B, H, n, k] uint8
    bins.masked_fill_(invalid, HIST_BINS)
    offsets = torch.arange(B * H * n, device=Av.device, dtype=torch.int32).view(B, H, n, 1) * (HIST_BINS + 1)
    index = (bins + offsets).flatten()
    del bins
    counts = torch.bincount(index, minlength=B * H * n * (HIST_BINS + 1)).view(B, H, n, HIST_BINS + 1)
    del index
    counts = counts[..., :HIST_BINS].double().div_(row_entries.clamp(min=1)[..., None])
    acc["histogram"] += counts.sum((0, 2))
    del counts
    acc["gram"] += _gram(Av.flatten(2))


class LayerSums:
    """Sums of every statistic over one batch of one layer, added by chunks of query rows in order.

    ``real`` and ``special`` ``[B, T]`` bool; ``heads``: ``H``; ``edges[101]``. ``add(probs, keep, out, q0)``
    takes the maps of query rows ``q0 : q0 + n`` (``probs[B, H, n, Tk]`` with ``keep[B|1, 1|H, n, Tk]`` or None, or
    a ``ProbRows`` with ``keep`` None; keys ``:Tk``, ``Tk ≤ T``) and their per-head outputs ``out[B, n, H, d]``;
    one call with ``q0 = 0`` and ``n = T`` is a whole layer. ``finish()`` returns float64 tensors: ``[H]`` for each
    name of ``ROW_METRICS``, ``SENTENCE_METRICS`` and ``confidence_no_special``; ``sparsity[len(thresholds), H]``
    (entry counts ≤ t), ``entries[H]`` (valid entries), ``histogram[H, 100]`` (each valid row adds 1 spread over the
    bins of its valid entries), ``similarity[4, H, H]`` (per-sentence matrices summed over sentences,
    ``SIMILARITIES`` order), and the counts ``n_rows`` (real query rows), ``n_rows_no_special`` and ``n_sentences``
    (scalars). The maps are read by blocks of query rows (``query_blocks``), so the memory beside ``probs`` is one
    block's temporaries (``block_rows``) and ``O(B·H·T)`` accumulators at any length (with a ``ProbRows``, no whole
    map exists at all). Every statistic is a sum, a count or a maximum over rows or entries, and the similarities'
    inner products are sums over entries, so neither the blocks nor the chunks change anything beyond the float
    rounding of the float64 sums (docs/analysis.md)."""

    def __init__(self, real: torch.Tensor, special: torch.Tensor, heads: int, thresholds: tuple[float, ...],
                 edges: torch.Tensor) -> None:
        self.real, self.special = real.bool(), special.bool() & real.bool()
        # Av is 0 off the valid block: dropping special keys leaves the plain block
        self.plain = self.real & ~self.special
        self.thresholds, self.edges, self.rows = thresholds, edges, 0  # rows: query rows added so far
        B, T = real.shape
        device, f64 = real.device, dict(dtype=torch.float64, device=real.device)
        self.sums = {name: torch.zeros(heads, **f64) for name in (*ROW_METRICS, "confidence_no_special")}
        self.acc = {"block_max": torch.zeros(B, heads, device=device),  # [B, H]: max over the valid block
                    "column_max": torch.zeros(B, heads, T, device=device),  # [B, H, Tk]: max over query rows
                    "below": torch.zeros(len(thresholds), heads, dtype=torch.int64, device=device),
                    "entries": torch.zeros(heads, dtype=torch.int64, device=device),
                    "histogram": torch.zeros(heads, HIST_BINS, **f64), "gram": torch.zeros(B, heads, heads, **f64),
                    "output_gram": torch.zeros(B, heads, heads, **f64)}

    @torch.no_grad()
    def add(self, probs: torch.Tensor | ProbRows, keep: torch.Tensor | None, out: torch.Tensor, q0: int = 0) -> None:
        B, H, n, Tk = probs.shape
        if q0 != self.rows or not (n <= Tk <= self.real.shape[1] and q0 + n <= Tk) or out.shape[:3] != (B, n, H):
            raise ValueError(f"query rows {q0}:{q0 + n} of {tuple(probs.shape)} maps after {self.rows} rows of "
                             f"{self.real.shape[1]} tokens: chunks of one layer come in order, within its keys")
        for b0, b1, Av, keep_b in query_blocks(probs, keep, diagonal=True, offset=q0):
            _add_block(self.sums, self.acc, q0 + b0, q0 + b1, Av, keep_b, self.real, self.special, self.plain,
                       self.thresholds, self.edges)
            del Av, keep_b  # freed before the next block is computed
        self.acc["output_gram"] += _output_gram(out, self.real[:, q0 : q0 + n])
        self.rows = q0 + n

    @torch.no_grad()
    def finish(self) -> dict[str, torch.Tensor]:
        if self.rows != self.real.shape[1]:
            raise ValueError(f"a layer's statistics finished after {self.rows} of {self.real.shape[1]} query rows")
        sums, acc, real = dict(self.sums), self.acc, self.real
        H, f64 = acc["entries"].shape[0], dict(dtype=torch.float64, device=real.device)
        sentence = real.any(1).double()  # [B]
        sums["mhr_base"] = (acc["block_max"].double() * sentence[:, None]).sum(0)
        n_keys = real.sum(1).clamp(min=1).double()  # [B]
        column_mean = (acc["column_max"] * real[:, None, :]).sum(-1).double() / n_keys[:, None]  # [B, H]
        sums["mhr_advanced"] = (column_mean * sentence[:, None]).sum(0)
        sums["sparsity"] = acc["below"].double() if self.thresholds else torch.zeros(0, H, **f64)
        sums["entries"] = acc["entries"].double()
        sums["histogram"] = acc["histogram"]
        sims = [*_pairwise(acc["gram"]), *_pairwise(acc["output_gram"])]
        sums["similarity"] = torch.stack([(s * sentence[:, None, None]).sum(0) for s in sims])
        sums["n_rows"] = real.sum().double()
        sums["n_rows_no_special"] = self.plain.sum().double()
        sums["n_sentences"] = sentence.sum()
        return sums


@torch.no_grad()
def batch_sums(probs: torch.Tensor | ProbRows, keep: torch.Tensor | None, out: torch.Tensor, real: torch.Tensor,
               special: torch.Tensor, thresholds: tuple[float, ...], edges: torch.Tensor) -> dict[str, torch.Tensor]:
    """``LayerSums.finish()`` of one whole layer: ``probs[B, H, T, T]`` (or a ``ProbRows``), ``out[B, T, H, d]``."""
    B, H, T, Tk = probs.shape
    if T != Tk or real.shape != (B, T):
        raise ValueError(f"self-attention maps expected: probs {tuple(probs.shape)}, real mask {tuple(real.shape)}")
    sums = LayerSums(real, special, H, thresholds, edges)
    sums.add(probs, keep, out)
    return sums.finish()
