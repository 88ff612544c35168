"""Buffers that grow to their rule, and windows that scale with the sequence: a policy never holds more bytes than
the full cache at any prompt length, holds its budget at every length up to the one it was sized for, and still
computes what the masked dense reference computes (buffers that grow, rings that wrap; left padding)."""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from transformers.cache_utils import DynamicCache

import headwise
from headwise import HeadwiseError
from headwise.compat import CACHE
from headwise.kvcache import FULL, HeadCache, KVPolicy, full_heads_for_budget, policy_cache, policy_forward, streaming
from test_kvcache import causal_lm, reference_logits
from test_kvcache_runtime import assert_matches_reference, greedy, ragged_batch

CONTEXT, BUDGET, SINK = 4096, 0.5, 4


def sixteen_kv_heads() -> tf.PreTrainedModel:
    """A tiny Llama with 2 layers x 8 KV heads (16 in all) and head dim 4: long prompts stay cheap."""
    torch.manual_seed(0)
    config = tf.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=8,
                            intermediate_size=16, vocab_size=64, max_position_embeddings=16384)
    return tf.AutoModelForCausalLM.from_config(config, attn_implementation="headwise").eval()


def budget_policy(model, scaled: bool) -> KVPolicy:
    """The policy kv_policy builds for BUDGET at CONTEXT (its default window), heads picked in order."""
    from headwise.kvcache.choose import default_window

    window = default_window(BUDGET, CONTEXT, SINK)
    n_full = full_heads_for_budget(16, BUDGET, CONTEXT, SINK, window, scaled)
    full = {(h // 8, h % 8) for h in range(n_full)}
    return KVPolicy.keep_full(model, full, SINK, window, CONTEXT if scaled else None)


def prefill_bytes(model, cache, length: int, chunk: int = 512) -> int:
    ids = torch.randint(3, 60, (1, length), generator=torch.Generator().manual_seed(length))
    with torch.no_grad():
        for start in range(0, length, chunk):
            model(ids[:, start:start + chunk], **{CACHE: cache}, use_cache=True)
    if isinstance(cache, DynamicCache):
        return sum(t.untyped_storage().nbytes() for layer in cache.layers for t in (layer.keys, layer.values))
    return cache.stored_bytes()


@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("length", [16, 300, 2000, 8000])
def test_the_policy_never_holds_more_than_the_full_cache(length, scaled):
    model = sixteen_kv_heads()
    policy = budget_policy(model, scaled)
    headwise.apply_kv_policy(model, policy)
    held = prefill_bytes(model, policy_cache(model, length=length), length)
    full = prefill_bytes(model, DynamicCache(config=model.config), length)
    assert held <= full
    slot = full // (length * 16)  # bytes of one token of one KV head (keys + values)
    streaming_heads = sum(not c.full for layer in policy.heads for c in layer)
    # the tokens the rule keeps, plus at most the newest token's ring slot per streaming head
    assert policy.stored_tokens(length) * slot <= held <= (policy.stored_tokens(length) + streaming_heads) * slot
    if scaled and length >= 512 or length == CONTEXT or length > CONTEXT:
        assert held <= BUDGET * full + streaming_heads * slot


def test_the_budget_holds_at_every_length_up_to_the_sized_one():
    model = sixteen_kv_heads()
    scaled, fixed = budget_policy(model, True), budget_policy(model, False)
    for length in (512, 1024, 2048, 3000, CONTEXT):
        assert scaled.kv_fraction(length) <= BUDGET
    assert fixed.kv_fraction(512) > 0.9 and fixed.kv_fraction(CONTEXT) <= BUDGET  # what a fixed window costs
    assert scaled.kv_fraction(4 * CONTEXT) < BUDGET  # past the sized length the window stops growing
    shares = scaled.savings()
    assert set(shares) == {512, 2048, 8192, CONTEXT} and "at 4k" in scaled.describe()


def scaled_policy(model) -> KVPolicy:
    """Layer 0: full and a window of 6 sized for 104 tokens (sink 2); layer 1: windows of 5 sized for 130 and of 4
    sized for 52 (sinks 1 and 0): a 52-token generation resolves them to 3, 2 and 4."""
    shape = KVPolicy.uniform(model).kv_heads
    first = [FULL if h % 2 == 0 else streaming(2, 6, context=104) for h in range(shape[0])]
    second = [streaming(1, 5, context=130) if h % 2 == 0 else streaming(0, 4, context=52) for h in range(shape[1])]
    return KVPolicy((tuple(first), tuple(second)))


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("chunk", [None, 4])
def test_scaled_windows_equal_the_masked_dense_reference(family, chunk):
    model = causal_lm(family)
    inputs = ragged_batch([23, 16, 21])
    policy = scaled_policy(model)
    headwise.apply_kv_policy(model, policy, prefill_chunk=chunk)
    out = greedy(model, inputs)  # generate builds the cache for 23 + 30 - 1 = 52 tokens
    assert out[CACHE].length == 52
    resolved = policy.at(52)
    assert [c.window for c in resolved.heads[1][:2]] == [2, 4] and resolved.heads[0][1].window == 3
    assert_matches_reference(model, resolved, inputs, out)


def test_a_scaled_policy_runs_as_the_fixed_policy_of_its_length():
    model = causal_lm("llama")
    inputs = ragged_batch([12, 9])
    headwise.apply_kv_policy(model, KVPolicy.uniform(model, streaming(1, 8, context=40)), prefill_chunk=None)
    scaled = greedy(model, inputs, steps=9)  # a cache for 20 tokens: window 8 · 20 // 40 = 4
    headwise.apply_kv_policy(model, KVPolicy.uniform(model, streaming(1, 4)), prefill_chunk=None)
    fixed = greedy(model, inputs, steps=9)
    assert torch.equal(scaled.sequences, fixed.sequences)
    for a, b in zip(scaled.logits, fixed.logits):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    # a forward through policy_forward is its own sequence: its input length fixes the window
    with torch.no_grad(), policy_forward(model, KVPolicy.uniform(model, streaming(1, 8, context=40))):
        ids = inputs["input_ids"][:1]
        through = model(ids).logits
    torch.testing.assert_close(through, reference_logits(model, KVPolicy.uniform(model, streaming(1, 2)), ids,
                                                         torch.ones_like(ids)), atol=1e-4, rtol=1e-4)


def test_a_scaled_rule_resolves_to_a_fixed_window_per_length():
    rule = streaming(4, 764, context=2048)
    assert rule.at(1024) == streaming(4, 382) and rule.at(2048) == streaming(4, 764)
    assert rule.at(8192) == streaming(4, 764) and rule.at(None) == streaming(4, 764) and rule.at(1) == streaming(4, 1)
    assert rule.stored(1024) == 4 + 382 and rule.stored(100) == 4 + 37 and streaming(4, 764).stored(1024) == 768
    assert HeadCache.from_json(rule.to_json()) == rule and HeadCache.from_json({"sink": 4, "window": 9}).context is None


@pytest.mark.parametrize("bad", [dict(sink=1, window=8, context=4), dict(sink=0, window=None, context=8),
                                 dict(sink=1, window=4, context=2.5)])
def test_bad_scaled_windows_are_refused(bad):
    with pytest.raises(HeadwiseError, match="context"):
        HeadCache(**bad)


def test_policy_files_with_scaled_windows_round_trip(tmp_path):
    model = sixteen_kv_heads()
    policy = budget_policy(model, True)
    loaded = KVPolicy.load(policy.save(tmp_path / "policy.json"))
    assert loaded == policy
    with pytest.raises(HeadwiseError, match="bad head entry"):
        KVPolicy.from_dict({"format": "headwise-kv-policy", "version": 2,
                            "heads": [[{"sink": 1, "window": 4, "context": "8"}]]})


def test_the_prefill_chunk_follows_the_device():
    from headwise.kvcache.generation import CPU_PREFILL_CHUNK, accelerator_chunk, prefill_chunk_for

    model = causal_lm("llama")
    assert prefill_chunk_for(model, "auto", 4, 10_000) == CPU_PREFILL_CHUNK
    assert prefill_chunk_for(model, 64, 4, 10_000) == 64 and prefill_chunk_for(model, None, 4, 10_000) is None
    meta = causal_lm("llama", device="meta")
    assert prefill_chunk_for(meta, "auto", 1, 10_000) == CPU_PREFILL_CHUNK
    # a GPU: Llama-3-8B's shapes in bf16 with 100 GiB free take an 8k prompt whole and a 64k one in 8k chunks;
    # a batch of 8 at 32k with 40 GiB free: 8 · 2 B · (3 · 14336 + 4 · 4096 + 32768) = 1.47 MB a token, 2048 of
    # them fit an eighth of what is free (4096 do not)
    big = tf.LlamaConfig(hidden_size=4096, intermediate_size=14336)
    assert accelerator_chunk(big, 2, 1, 8192, 100 << 30) is None
    assert accelerator_chunk(big, 2, 1, 65536, 100 << 30) == 8192
    assert accelerator_chunk(big, 2, 8, 32768, 40 << 30) == 2048
    assert accelerator_chunk(big, 2, 64, 32768, 1 << 30) == 1024  # never below the smallest choice


def test_generate_prefills_in_the_chunk_the_device_gives(monkeypatch):
    from headwise.kvcache import generation as policy_generation

    model = causal_lm("llama")
    headwise.apply_kv_policy(model, KVPolicy.uniform(model, streaming(1, 3)))  # prefill_chunk="auto"
    monkeypatch.setattr(policy_generation, "CPU_PREFILL_CHUNK", 4)
    lengths = []
    model.register_forward_pre_hook(lambda m, a, k: lengths.append(k["input_ids"].shape[1]), with_kwargs=True)
    greedy(model, ragged_batch([10]), steps=2)
    assert lengths == [4, 4, 2, 1]
