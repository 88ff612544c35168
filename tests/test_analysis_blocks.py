"""Statistics accumulated over blocks of query rows against the dense path (the whole map in one block), and the
memory a block takes: the statistics of a layer hold one block's temporaries (``metrics.block_bytes``) beside
``O(B·H·T)`` accumulators, whatever the length."""

from __future__ import annotations

import pytest
import torch

from headwise.analysis import metrics
from headwise.analysis.metrics import ENTRY_BYTES, ROW_BYTES, batch_sums, histogram_edges, query_blocks
from headwise.analysis.roles import role_sums
from headwise.runtime.probs import ProbRows, keep_mask
from peak_bytes import peak_tensor_bytes
from test_analysis_support import THRESHOLDS

B, T, D = 3, 13, 8  # 13 query rows: blocks of 4 and 5 rows do not divide them


def _case(kind: str, dtype: torch.dtype) -> tuple[ProbRows, torch.Tensor, torch.Tensor]:
    """``(ProbRows, real[B, T], special[B, T])`` of one attention call. ``encoder``: 4 heads, right padding in a
    boolean mask, not causal; ``causal``: GQA (4 query heads on 2 key heads), no mask at all; ``causal-padded``:
    GQA with left padding in a causal boolean mask (a decoder's padded batch); ``additive``: an additive float
    mask with right padding and a position bias (T5-like)."""
    gen = torch.Generator().manual_seed(5)
    heads, kv = (4, 2) if kind.startswith("causal") else (4, 4)
    query = (torch.randn(B, heads, T, D, generator=gen) * 2).to(dtype)
    key = (torch.randn(B, kv, T, D, generator=gen) * 2).to(dtype)
    real = torch.ones(B, T, dtype=torch.bool)
    special = torch.zeros(B, T, dtype=torch.bool)
    causal = kind.startswith("causal")
    mask, bias = None, None
    if kind == "encoder":
        real[1, 9:], real[2, 4:] = False, False
        mask = (real[:, None, :] & real[:, :, None])[:, None]
        special[:, 0] = True
        special[0, T - 1], special[1, 8], special[2, 3] = True, True, True
    elif kind == "causal-padded":
        real[1, :3], real[2, :6] = False, False
        mask = (real[:, None, :] & torch.ones(T, T, dtype=torch.bool).tril())[:, None]
        special[0, 0], special[1, 3], special[2, 6] = True, True, True
    elif kind == "additive":
        real[2, 10:] = False
        mask = torch.zeros(B, 1, T, T, dtype=dtype).masked_fill(~real[:, None, None, :], torch.finfo(dtype).min)
        bias = torch.randn(1, heads, T, T, generator=gen).to(dtype)
        special[:, T - 1] = True
    else:
        special[:, 0] = True
    return ProbRows(query, key, mask, D ** -0.5, causal, bias, dtype), real, special


KINDS = ["encoder", "causal", "causal-padded", "additive"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 4, 5])
@pytest.mark.parametrize("kind", KINDS)
def test_block_statistics_equal_the_dense_ones(kind, rows, dtype, monkeypatch):
    """Every statistic of ``batch_sums`` by blocks of ``rows`` query rows (each block cropped to the keys its rows
    see) equals the dense path: the whole map, computed at once, in one block. Both read the same probabilities
    (rounded to ``dtype``), so they agree to float32 rounding in bfloat16 too."""
    probs, real, special = _case(kind, dtype)
    gen = torch.Generator().manual_seed(6)
    out = torch.randn(B, T, probs.shape[1], D, generator=gen).to(dtype)
    keep = keep_mask(probs.mask, T, T, probs.causal, probs.device)
    args = (out, real, special, THRESHOLDS, histogram_edges())
    dense = batch_sums(probs.full(), keep, *args)  # T rows fit a block at these sizes
    monkeypatch.setattr(metrics, "block_rows", lambda *shape: rows)
    blocked = batch_sums(probs, None, *args)
    assert blocked.keys() == dense.keys()
    for name, value in dense.items():
        torch.testing.assert_close(blocked[name], value, atol=1e-6, rtol=1e-5, msg=name)
    assert dense["n_rows"] == real.sum() and (dense["histogram"].sum(-1) > 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk", [1, 4, 5])
@pytest.mark.parametrize("kind", ["causal", "causal-padded"])
def test_layer_sums_added_by_chunks_of_queries_equal_the_whole_layer(kind, chunk, dtype):
    """``LayerSums`` fed a causal layer chunk by chunk, as a layer run by chunks of queries calls its observers
    (rows ``c0:c1`` against keys ``:c1``, the mask cut to them; chunks of 4 and 5 do not divide 13), equals the
    whole layer in one call; chunks out of order, and finishing early, are refused."""
    probs, real, special = _case(kind, dtype)
    gen = torch.Generator().manual_seed(6)
    out = torch.randn(B, T, probs.shape[1], D, generator=gen).to(dtype)
    whole = batch_sums(probs, None, out, real, special, THRESHOLDS, histogram_edges())
    sums = metrics.LayerSums(real, special, probs.shape[1], THRESHOLDS, histogram_edges())
    for c0 in range(0, T, chunk):
        c1 = min(T, c0 + chunk)
        mask = None if probs.mask is None else probs.mask[..., c0:c1, :c1]
        if mask is None:  # a chunk has no plain causal form: its mask is explicit
            mask = (torch.arange(c0, c1)[:, None] >= torch.arange(c1))[None, None]
        rows = ProbRows(probs.query[:, :, c0:c1], probs.key[:, :, :c1], mask, D ** -0.5, True, None, dtype)
        if c0 == chunk:
            with pytest.raises(ValueError, match="in order"):
                sums.add(rows, None, out[:, c0:c1], c0 + 1)
        sums.add(rows, None, out[:, c0:c1], c0)
        if c1 < T:
            with pytest.raises(ValueError, match="finished after"):
                metrics.LayerSums(real, special, probs.shape[1], THRESHOLDS, histogram_edges()).finish()
    chunked = sums.finish()
    assert chunked.keys() == whole.keys()
    for name, value in whole.items():
        torch.testing.assert_close(chunked[name], value, atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", KINDS)
def test_block_roles_equal_the_dense_ones(kind, dtype, monkeypatch):
    """``role_sums`` (argmax per row: positional and rare-token hits, row maxima) by blocks of 4 rows against the
    whole map; cross-attention (``dec-enc``, the diagonal proxy) on the same maps."""
    probs, real, _ = _case(kind, dtype)
    keep = keep_mask(probs.mask, T, T, probs.causal, probs.device)
    rarest = torch.zeros(B, T, dtype=torch.bool)
    rarest[:, 2] = True
    for role in ("enc-self", "dec-enc"):
        dense = role_sums(probs.full(), keep, role, real, real, rarest)
        with monkeypatch.context() as m:
            m.setattr(metrics, "block_rows", lambda *shape: 4)
            blocked = role_sums(probs, None, role, real, real, rarest)
        assert blocked.keys() == dense.keys()
        for name, value in dense.items():
            torch.testing.assert_close(blocked[name], value, atol=1e-6, rtol=1e-6, msg=f"{role} {name}")
        assert dense["rows"] == real.sum()


def test_causal_blocks_read_only_the_keys_their_rows_see(monkeypatch):
    """A causal block ``q0:q1`` ends at key ``q1 + 1`` (one key past the diagonal, for the next-token weight); a
    padded mask's blocks at the last key any of their rows keeps; keys past it have no weight in the dense map."""
    probs, _, _ = _case("causal", torch.float32)
    monkeypatch.setattr(metrics, "block_rows", lambda *shape: 5)
    spans = [(q0, q1, A.shape[-1]) for q0, q1, A, _ in query_blocks(probs, None, diagonal=True)]
    assert spans == [(0, 5, 6), (5, 10, 11), (10, 13, 13)]
    full = probs.full()
    assert (full[:, :, :5, 6:] == 0).all()
    encoder, real, _ = _case("encoder", torch.float32)
    ends = [A.shape[-1] for _, _, A, _ in query_blocks(encoder, None)]
    assert ends == [T, T, T]  # row 0 of the first sentence sees every key
    encoder.mask = encoder.mask[1:]  # the two padded sentences alone: no row sees keys past 9, and rows 10-12
    encoder.shape = torch.Size((2, *encoder.shape[1:]))  # are padding in both: they see none (one key is read)
    encoder.query, encoder.key = encoder.query[1:], encoder.key[1:]
    assert [A.shape[-1] for _, _, A, _ in query_blocks(encoder, None)] == [9, 9, 1]


@pytest.mark.parametrize("length", [128, 512])
def test_a_layers_statistics_hold_one_block_beside_their_accumulators(length, monkeypatch):
    """With blocks of 256 KiB of temporaries, the peak of ``batch_sums`` over a GQA causal layer stays within
    ``block_bytes`` plus its accumulators (a ``[B, H, T]`` column maximum and small per-head sums) at 128 and 512
    tokens: ``ENTRY_BYTES`` per entry of a block hold at any length (a dense pass over the 512-token map would
    hold 2 MiB per float32 copy, 8 MiB at 16 bytes an entry)."""
    budget = 256 << 10
    monkeypatch.setattr(metrics, "CPU_BLOCK_BYTES", budget)
    gen = torch.Generator().manual_seed(1)
    heads, d = 2, 16
    probs = ProbRows(torch.randn(1, heads, length, d, generator=gen), torch.randn(1, 1, length, d, generator=gen),
                     None, d ** -0.5, True, None, torch.float32)
    real = torch.ones(1, length, dtype=torch.bool)
    special = torch.zeros(1, length, dtype=torch.bool)
    special[:, 0] = True
    out = torch.randn(1, length, heads, d, generator=gen)
    rows = metrics.block_rows(1, heads, length, probs.device)
    assert rows * heads * (length * ENTRY_BYTES + ROW_BYTES) <= budget < 2 * rows * heads * length * ENTRY_BYTES
    args = (probs, None, out, real, special, THRESHOLDS, histogram_edges())
    batch_sums(*args)  # the histogram's lookup tables, built once per process
    peak = peak_tensor_bytes(lambda: batch_sums(*args))
    accumulators = heads * length * 4 + (64 << 10)  # the column maximum, and small per-head sums
    assert peak <= budget + accumulators, (peak, length)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", ["llama", "bert", "gpt2"])
def test_analyze_by_blocks_equals_the_dense_statistics_on_tiny_models(family, dtype, monkeypatch):
    """End to end on tiny models — Llama (causal, GQA), BERT (an encoder) and GPT-2 (causal, one key head per query
    head) — over padded batches of texts of 4 to 13 tokens: ``analyze`` with blocks of 5 query rows (they divide no
    length here) equals ``analyze`` with every row in one block (the dense statistics), table by table, in float32
    and in bfloat16 weights (the same forward in both runs: only the blocks differ)."""
    from headwise.analysis import analyze
    from test_analysis_support import loud_model, random_texts, word_tokenizer

    tokenizer, texts = word_tokenizer(family), random_texts(8, seed=12, shortest=3, longest=12)
    options = dict(batch_size=3, thresholds=THRESHOLDS, importance=(), examples=0, progress=False)
    model = loud_model(family).to(dtype)
    monkeypatch.setattr(metrics, "block_rows", lambda *shape: 1 << 20)
    dense = analyze(model, tokenizer, texts, **options).finalize()
    monkeypatch.setattr(metrics, "block_rows", lambda *shape: 5)
    blocked = analyze(model, tokenizer, texts, **options).finalize()
    for name, table in dense["heads"].items():
        torch.testing.assert_close(blocked["heads"][name], table, atol=1e-6, rtol=1e-5, equal_nan=True, msg=name)
    torch.testing.assert_close(blocked["histogram"], dense["histogram"], atol=1e-9, rtol=0, equal_nan=True)
    for name, table in dense["similarity"].items():
        torch.testing.assert_close(blocked["similarity"][name], table, atol=1e-6, rtol=1e-5, equal_nan=True, msg=name)


def test_the_statistics_forward_keeps_no_cache_and_no_full_logits():
    """``analyze`` without a gradient pass runs a causal LM for its attention calls only: its head projects the last
    position (no ``[B, T, V]`` logits) and no key/value cache is filled."""
    import transformers as tf

    from headwise.analysis import analyze
    from test_analysis_support import random_texts, word_tokenizer
    from tiny import VOCAB

    torch.manual_seed(3)
    config = tf.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=37, vocab_size=VOCAB, max_position_embeddings=64)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="headwise").eval()
    seen = []
    model.lm_head.register_forward_hook(lambda module, args, out: seen.append(tuple(out.shape)))
    model.register_forward_hook(lambda module, args, out: seen.append(out.past_key_values))
    stats = analyze(model, word_tokenizer("llama"), random_texts(4, seed=1, shortest=5), batch_size=2,
                    importance=(), examples=0, progress=False)
    assert stats.acc["sentences"] == 4
    assert seen == [(2, 1, VOCAB), None] * 2


@pytest.mark.parametrize("batch, chunk", [(3, 3), (1, 5), (2, 4)])
def test_the_statistics_forward_runs_decoder_layers_by_chunks_of_queries_with_the_same_statistics(batch, chunk,
                                                                                                 monkeypatch):
    """At long context the statistics pass runs each decoder layer over chunks of query positions
    (``forward_chunk_tokens``: the larger of the MLP's ``4·I`` and the attention's ``8·D`` transient elements per
    token within ``block_bytes``; ``layer_stack.chunked_layers``), so no projection, rotary copy or MLP activation
    over the whole length exists. On a tiny GQA Llama (4 query heads on 2 key heads) with a budget that forces chunks
    of ``chunk`` positions (not dividing the lengths, 7 to 12 tokens), padded batches (``batch`` > 1: the model's
    mask, cut by rows) and single texts (no mask: causal chunk masks), every query and MLP projection sees at most
    ``chunk`` positions, the keys grow chunk by chunk, and every table equals the one-call forward's (float32
    tolerance); the model's forwards are its own again afterwards."""
    import transformers as tf

    from headwise.analysis import activations, analyze
    from test_analysis_support import random_texts, word_tokenizer
    from tiny import VOCAB

    torch.manual_seed(4)
    config = tf.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=37, vocab_size=VOCAB, max_position_embeddings=64)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="headwise").eval()
    texts = random_texts(6, seed=2, shortest=7, longest=12)
    options = dict(batch_size=batch, max_length=16, thresholds=THRESHOLDS, importance=(), examples=0, progress=False)
    widths: list[tuple[str, int]] = []
    record = lambda kind: lambda module, args: widths.append((kind, args[0].shape[-2]))  # noqa: E731
    hooks = [h for layer in model.model.layers for h in (
        layer.mlp.gate_proj.register_forward_pre_hook(record("mlp")),
        layer.self_attn.q_proj.register_forward_pre_hook(record("query")),
        layer.self_attn.register_forward_hook(lambda module, args, kwargs, out: widths.append(
            ("keys", kwargs["position_embeddings"][0].shape[-2], kwargs["attention_mask"])), with_kwargs=True))]
    whole = analyze(model, word_tokenizer("llama"), texts, **options).finalize()
    assert max(w[1] for w in widths) > chunk
    widths.clear()
    per_token = batch * (8 * 32 * 4 + 16 * 5)  # 8·D above 4·I here, float32; a chunk's masks over 16 keys
    monkeypatch.setattr(activations, "MIN_CHUNK_TOKENS", 1)
    monkeypatch.setattr(activations, "block_bytes", lambda device: chunk * per_token)
    assert activations.forward_chunk_tokens(model, batch, 16) == chunk
    chunked = analyze(model, word_tokenizer("llama"), texts, **options).finalize()
    for hook in hooks:
        hook.remove()
    assert max(w[1] for w in widths) == chunk
    masks = [w[2] for w in widths if w[0] == "keys"]
    assert all(m is not None and m.shape[-2] <= chunk for m in masks)  # every chunk attends with explicit masks
    assert any(m.shape[-1] > chunk for m in masks)  # to the keys so far, more than its own rows
    assert all("forward" not in m.__dict__ for m in model.modules())
    for name, table in whole["heads"].items():
        torch.testing.assert_close(chunked["heads"][name], table, atol=1e-6, rtol=1e-5, equal_nan=True, msg=name)
    for name, table in whole["similarity"].items():
        torch.testing.assert_close(chunked["similarity"][name], table, atol=1e-6, rtol=1e-5, equal_nan=True, msg=name)
    torch.testing.assert_close(chunked["histogram"], whole["histogram"], atol=1e-6, rtol=1e-5, equal_nan=True)
