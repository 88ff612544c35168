"""The statistics from probabilities computed by query rows (``ProbRows``, the module running SDPA) against the
statistics from whole eager maps, and the memory that saves: no ``[B, H, T, T]`` tensor in the statistics forward
nor in a recomputed backward."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from headwise.analysis import analyze, metrics
from headwise.analysis.metrics import batch_sums, histogram_edges
from headwise.analysis.observer import MapRecorder, StatsObserver
from headwise.runtime.probs import ProbRows, keep_mask
from test_analysis_support import loud_model, THRESHOLDS, random_texts, word_tokenizer


@pytest.mark.parametrize("rows_per_chunk", [1, 5, None])
@pytest.mark.parametrize("mask", ["causal", "padded"])
def test_batch_sums_of_prob_rows_equal_those_of_the_full_maps(mask, rows_per_chunk, monkeypatch):
    """GQA (4 query heads on 2 key heads); ``causal``: no mask, a causal module; ``padded``: a boolean mask with
    right padding, as an encoder gets. Chunks of 5 rows do not divide 13."""
    B, H, T, d = 2, 4, 13, 8
    gen = torch.Generator().manual_seed(0)
    query, key = torch.randn(B, H, T, d, generator=gen), torch.randn(B, 2, T, d, generator=gen)
    real = torch.ones(B, T, dtype=torch.bool)
    real[1, 9:] = False
    attention_mask = None if mask == "causal" else (real[:, None, :] & real[:, :, None])[:, None]
    special = torch.zeros(B, T, dtype=torch.bool)
    special[:, 0] = True
    rows = ProbRows(query, key, attention_mask, d ** -0.5, mask == "causal", None, torch.float32)
    keep = keep_mask(attention_mask, T, T, mask == "causal", query.device)
    args = (torch.randn(B, T, H, d, generator=gen), real, special, THRESHOLDS, histogram_edges())
    if rows_per_chunk is not None:
        monkeypatch.setattr(metrics, "block_rows", lambda *shape: rows_per_chunk)
    lazy, whole = batch_sums(rows, None, *args), batch_sums(rows.full(), keep, *args)
    assert lazy.keys() == whole.keys()
    for name, value in whole.items():
        torch.testing.assert_close(lazy[name], value, atol=1e-6, rtol=1e-5, msg=name)


def _eager_observers(monkeypatch) -> None:
    """Make the analysis observers take whole maps: the runtime then runs the explicit softmax (today's path)."""
    monkeypatch.setattr(StatsObserver, "takes_rows", False)
    monkeypatch.setattr(MapRecorder, "takes_rows", False)


def _assert_same(got: dict, ref: dict, atol: float, rtol: float = 1e-4) -> None:
    for part in ("heads", "similarity"):
        for name, table in ref[part].items():
            np.testing.assert_allclose(np.array(got[part][name], dtype=float), np.array(table, dtype=float),
                                       atol=atol, rtol=rtol, equal_nan=True, err_msg=name)
    np.testing.assert_allclose(np.array(got["histogram"]["counts"], dtype=float),
                               np.array(ref["histogram"]["counts"], dtype=float), atol=atol, rtol=0)
    for mine, theirs in zip(got["examples"], ref["examples"]):  # stored rounded to 5 decimals: one step more
        np.testing.assert_allclose(np.array(mine["maps"]), np.array(theirs["maps"]), atol=atol + 1.01e-5, rtol=0)


@pytest.mark.parametrize("recompute", [False, True, "tight"], ids=["kept", "recomputed", "tight margin"])
@pytest.mark.parametrize("family", ["llama", "bert"])
def test_analyze_by_rows_equals_the_eager_maps(family, recompute, monkeypatch):
    """End to end, float32, gradient importance and example maps included: a tiny Llama (GQA, causal, BOS as the
    special token) and a tiny BERT (padding, not causal), with chunks of 2 query rows. ``tight margin``: a margin
    of one byte, so the Llama runs layer by layer (its statistics from the chunked forward without gradients,
    ``analysis.layerwise``) and the BERT in segments."""
    from headwise.analysis import activations, layerwise

    tokenizer, texts = word_tokenizer(family), random_texts(7, seed=3)
    options = dict(batch_size=3, thresholds=THRESHOLDS, importance=("gradient",), examples=2,
                   recompute=recompute is not False, progress=False)
    monkeypatch.setattr(metrics, "block_rows", lambda *shape: 2)
    if recompute == "tight":
        monkeypatch.setattr(activations, "margin_bytes", lambda model: 1)
        monkeypatch.setattr(activations, "backward_chunk_tokens", lambda *shape: 3)  # chunks of 3 queries
    passes = []
    monkeypatch.setattr(layerwise.LayerwiseBackward, "backward",
                        lambda self, *a, original=layerwise.LayerwiseBackward.backward: passes.append(self.tokens)
                        or original(self, *a))
    lazy = analyze(loud_model(family), tokenizer, texts, **options).to_dict()
    assert bool(passes) == (recompute == "tight" and family == "llama") and set(passes) <= {3}
    monkeypatch.undo()
    monkeypatch.setattr(metrics, "block_rows", lambda *shape: 2)
    _eager_observers(monkeypatch)
    eager = analyze(loud_model(family), tokenizer, texts, **options).to_dict()
    assert lazy["sentences"] == eager["sentences"] == 7 and lazy["tokens"] == eager["tokens"]
    _assert_same(lazy, eager, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("family", ["llama", "bert"])
def test_analyze_by_rows_in_half_precision(family, dtype, monkeypatch):
    """Half-precision weights: the statistics by rows run, are finite and agree with the eager maps' to the
    precision's rounding (both round the probabilities to ``dtype``, but from different hidden states)."""
    tokenizer, texts = word_tokenizer(family), random_texts(5, seed=4)
    options = dict(batch_size=3, importance=("gradient",), examples=1, recompute=True, progress=False)
    lazy = analyze(loud_model(family).to(dtype), tokenizer, texts, **options)
    _eager_observers(monkeypatch)
    eager = analyze(loud_model(family).to(dtype), tokenizer, texts, **options).to_dict()
    for name in ("confidence", "entropy", "self", "importance_gradient"):
        assert torch.isfinite(lazy[name]).all(), name
    assert lazy.to_dict()["tokens"] == eager["tokens"]
    _assert_same(lazy.to_dict(), eager, atol=0.05, rtol=0.02)


class _BigMaps(TorchDispatchMode):
    """Records, per phase, the shapes of the ``[B, H, T, T]`` tensors (``H`` heads, ``T ≥ 16``) any op creates."""

    def __init__(self, heads: int) -> None:
        super().__init__()
        self.heads, self.phase, self.seen = heads, "forward", {"forward": set(), "backward": set()}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if (isinstance(t, torch.Tensor) and t.dim() == 4 and t.shape[1] == self.heads
                    and t.shape[2] == t.shape[3] >= 16):
                self.seen[self.phase].add(tuple(t.shape))
        return out


@pytest.mark.parametrize("plan", ["blocks", "layers"])
def test_no_whole_map_in_the_statistics_forward_nor_the_recomputed_backward(plan, monkeypatch):
    """With the blocks recomputed, the statistics forward reads the maps by chunks of query rows (the attention
    itself runs SDPA) and the backward recomputes each block with SDPA (the observers are inactive then): no op
    creates a ``[B, H, T, T]`` tensor, so none can be saved for the backward. (The explicit softmax made them in
    both: the maps of the whole layer in the forward, and for each recomputed block, kept for its backward.) The
    same layer by layer (``analysis.layerwise``)."""
    from headwise.analysis import activations

    if plan == "layers":  # one layer at a time, by chunks of 5 queries
        monkeypatch.setattr(activations, "margin_bytes", lambda model: 1)
        monkeypatch.setattr(activations, "backward_chunk_tokens", lambda *shape: 5)
    tokenizer, model = word_tokenizer("llama"), loud_model("llama")
    texts = random_texts(4, seed=5, shortest=20, longest=30)  # T > 16 > head_dim, heads: no [B, H, T, d] counted
    monkeypatch.setattr(metrics, "block_rows", lambda *shape: 3)  # 3 query rows a block
    recorder = _BigMaps(model.config.num_attention_heads)
    grad = torch.autograd.grad

    def backward(*args, **kwargs):
        recorder.phase = "backward"
        try:
            return grad(*args, **kwargs)
        finally:
            recorder.phase = "forward"

    monkeypatch.setattr(torch.autograd, "grad", backward)
    with recorder:
        stats = analyze(model, tokenizer, texts, batch_size=4, importance=("gradient",), examples=0, recompute=True,
                        progress=False)
    how = "blocks recomputed" if plan == "blocks" else "layer by layer"
    assert stats.seconds.keys() == {"observe", f"gradient ({how})"}
    assert recorder.seen["backward"] == set()
    assert recorder.seen["forward"] == set()
