"""Observer statistics against full-map references computed from the eager model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headwise.analysis import AnalysisConfig, HeadStats, analyze
from headwise.analysis import metrics
from headwise.analysis.metrics import SIMILARITIES, batch_sums, histogram_edges
from headwise.runtime import ops_of
from headwise.sites import find_sites
from headwise.errors import HeadwiseError
from test_analysis_support import loud_model, THRESHOLDS, random_texts, reference_stats, run_eager, padded, word_tokenizer
from tiny import CAUSAL

NO_IMPORTANCE = dict(importance=(), examples=0)


@pytest.mark.parametrize("chunk", [None, 1], ids=["default", "row-by-row"])
@pytest.mark.parametrize("family", ["bert", "gpt2", "albert", "llama"])
def test_every_metric_matches_eager_reference(family, chunk, monkeypatch):
    """``chunk``: query rows per block in ``batch_sums`` (1: one query row at a time; None: the default, the whole
    batch in one block at these sizes)."""
    if chunk is not None:
        monkeypatch.setattr(metrics, "block_rows", lambda *shape: chunk)
    tokenizer = word_tokenizer(family)
    texts = random_texts(7, seed=3)
    stats = analyze(loud_model(family), tokenizer, texts, batch_size=3, thresholds=THRESHOLDS, progress=False,
                    **NO_IMPORTANCE)  # 3 padded batches
    ref = reference_stats(loud_model(family, attn="eager"), tokenizer, texts, causal=family in CAUSAL)
    final = stats.finalize()
    assert list(final["heads"]) == stats.metric_names == [*ref["heads"]]
    for name, table in ref["heads"].items():
        np.testing.assert_allclose(final["heads"][name].numpy(), table, atol=1e-5, rtol=0, err_msg=name)
    np.testing.assert_allclose(final["histogram"].numpy(), ref["histogram"], atol=1e-5, rtol=0)
    for name in SIMILARITIES:
        np.testing.assert_allclose(final["similarity"][name].numpy(), ref["similarity"][name], atol=1e-5, rtol=0,
                                   err_msg=name)
    assert stats.acc["sentences"].item() == 7
    assert stats.acc["tokens"].item() == sum(len(t.split()) for t in texts) + (1 if family in CAUSAL else 2) * 7


@pytest.mark.parametrize("rows_per_chunk", [1, 4, 5, 13])
def test_batch_sums_do_not_depend_on_the_chunks_of_query_rows(rows_per_chunk, monkeypatch):
    """Chunks of 4 and 5 rows do not divide 13 query rows: the last chunk is short, the diagonals (self, prev,
    next) cross chunk borders; left padding and a causal mask make rows of different valid lengths."""
    B, H, T, d = 2, 3, 13, 4
    gen = torch.Generator().manual_seed(0)
    real = torch.ones(B, T, dtype=torch.bool)
    real[1, :3] = False
    keep = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
    probs = torch.rand(B, H, T, T, generator=gen).masked_fill(~keep, 0.0).softmax(-1)
    special = torch.zeros(B, T, dtype=torch.bool)
    special[:, 3] = True
    args = (probs, keep, torch.randn(B, T, H, d, generator=gen), real, special, (0.01, 0.1, 0.5), histogram_edges())
    whole = batch_sums(*args)
    monkeypatch.setattr(metrics, "block_rows", lambda *shape: rows_per_chunk)
    chunked = batch_sums(*args)
    assert whole.keys() == chunked.keys()
    for name, value in whole.items():
        torch.testing.assert_close(chunked[name], value, atol=1e-6, rtol=1e-5, msg=name)  # float32 row sums


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_batches_without_padding_match_reference(family):
    """Equal lengths: the runtime may pass no mask at all (keep=None), the observers must still be exact."""
    tokenizer = word_tokenizer(family)
    texts = random_texts(4, seed=9, shortest=6, longest=6)
    stats = analyze(loud_model(family), tokenizer, texts, progress=False, **NO_IMPORTANCE)
    ref = reference_stats(loud_model(family, attn="eager"), tokenizer, texts, causal=family in CAUSAL)
    for name, table in ref["heads"].items():
        np.testing.assert_allclose(stats[name].numpy(), table, atol=1e-5, rtol=0, err_msg=name)


def test_albert_gets_one_row_per_layer():
    model = loud_model("albert")
    (site,) = find_sites(model)
    assert site.layers == (0, 1, 2)
    stats = analyze(model, word_tokenizer("albert"), random_texts(5), progress=False, **NO_IMPORTANCE)
    doc = stats.to_dict()
    assert [s["name"] for s in doc["sites"]] == ["enc-self.0", "enc-self.1", "enc-self.2"]
    assert [s["layers"] for s in doc["sites"]] == [[0], [1], [2]]
    assert {s["path"] for s in doc["sites"]} == {site.path}
    entropy = stats["entropy"]
    assert entropy.shape == (3, 4) and not torch.allclose(entropy[0], entropy[1])  # the layers really differ
    assert torch.equal(stats.acc["n_rows"], torch.full((3,), stats.acc["tokens"].item(), dtype=torch.float64))


def test_statistics_memory_does_not_grow_with_data():
    model, tokenizer = loud_model("bert"), word_tokenizer("bert")
    small = analyze(model, tokenizer, random_texts(4), progress=False, **NO_IMPORTANCE)
    large = analyze(model, tokenizer, random_texts(40, seed=1, longest=30), progress=False, **NO_IMPORTANCE)
    assert large.acc["sentences"].item() == 10 * small.acc["sentences"].item()
    assert {k: v.shape for k, v in small.acc.items()} == {k: v.shape for k, v in large.acc.items()}
    shapes = lambda doc: {k: np.array(v).shape for k, v in doc["heads"].items()}  # noqa: E731
    assert shapes(small.to_dict()) == shapes(large.to_dict())


def test_examples_hold_the_full_maps_of_the_first_sentences():
    model, tokenizer = loud_model("gpt2"), word_tokenizer("gpt2")
    texts = random_texts(5, seed=2)
    stats = analyze(model, tokenizer, texts, examples=2, importance=(), progress=False)
    assert [e["text"] for e in stats.examples] == texts[:2]
    inputs, _, _ = padded(tokenizer, texts[:1])
    _, maps, _ = run_eager(loud_model("gpt2", attn="eager"), inputs)
    first = stats.examples[0]
    assert first["tokens"] == ["<s>"] + texts[0].split()
    got = np.array(first["maps"])  # [rows, heads, Tq, Tk]
    want = torch.stack([m[0] for m in maps]).numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-4)
    # cut to the first example_tokens tokens: a causal model's maps of a prefix are the prefix's block of the maps
    short = analyze(model, tokenizer, texts, examples=1, example_tokens=3, importance=(), progress=False).examples[0]
    assert short["tokens"] == first["tokens"][:3]
    np.testing.assert_allclose(np.array(short["maps"]), want[..., :3, :3], atol=1e-4)


def test_special_tokens_are_excluded_where_defined():
    """On one sentence, direct check of the definitions that involve special tokens and padding."""
    torch.manual_seed(0)
    B, H, T = 2, 3, 5
    probs = torch.rand(B, H, T, T).softmax(-1)
    real = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    special = torch.tensor([[1, 0, 0, 1, 0], [1, 0, 0, 0, 1]], dtype=torch.bool)
    keep = (real[:, None, None, :]).expand(B, 1, T, T)
    sums = batch_sums(probs, keep, torch.randn(B, T, H, 2), real, special, (), histogram_edges())
    want = probs[0, :, 1:3, 1:3].amax(-1).sum(-1) + probs[1, :, 1:4, 1:4].amax(-1).sum(-1)
    torch.testing.assert_close(sums["confidence_no_special"].float(), want)
    assert sums["n_rows_no_special"].item() == 2 + 3
    want = probs[0, :, :4, [0, 3]].sum((-1, -2)) + probs[1, :, :, [0, 4]].sum((-1, -2))
    torch.testing.assert_close(sums["special"].float(), want)
    assert torch.allclose(sums["histogram"].sum(-1), torch.full((H,), 9.0, dtype=torch.float64))


def test_observers_are_detached_and_attention_restored_even_on_error():
    model, tokenizer = loud_model("bert", attn="sdpa"), word_tokenizer("bert")
    analyze(model, tokenizer, random_texts(3), progress=False, examples=1, importance=("gradient", "ablation"))
    assert model.config._attn_implementation == "sdpa"
    assert all(ops_of(s) is None for s in find_sites(model))

    def fail(*_):
        raise RuntimeError("boom")

    handle = model.register_forward_hook(fail)
    with pytest.raises(RuntimeError, match="boom"):
        analyze(model, tokenizer, random_texts(3), progress=False, **NO_IMPORTANCE)
    handle.remove()
    assert model.config._attn_implementation == "sdpa"
    assert all(ops_of(s) is None for s in find_sites(model))


def test_config_and_options():
    cfg = AnalysisConfig(batch_size=2, importance="gradient", thresholds=[0.5])
    assert cfg.importance == ("gradient",) and cfg.thresholds == (0.5,)
    with pytest.raises(HeadwiseError, match="importance=\\(\\), examples=0 conflicts with the AnalysisConfig"):
        analyze(loud_model("bert"), word_tokenizer("bert"), random_texts(3), cfg, importance=(), examples=0,
                progress=False)  # a keyword never silently overrides the config
    cfg = AnalysisConfig(batch_size=2, importance=(), examples=0, thresholds=[0.5])
    stats = analyze(loud_model("bert"), word_tokenizer("bert"), random_texts(3), cfg, progress=False)
    assert isinstance(stats, HeadStats) and "sparsity@0.5" in stats.to_dict()["heads"]
    with pytest.raises(Exception, match="unknown importance"):
        AnalysisConfig(importance=("magic",))
