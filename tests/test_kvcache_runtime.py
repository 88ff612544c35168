"""The per-head cache's buffers against the masked dense reference: ring buffers that wrap many times, chunked
prefill (in plain ``generate()``), left-padded batches equal to one-by-one runs, fp16/bf16 and ``meta``."""

from __future__ import annotations

import pytest
import torch

import headwise
from headwise import HeadwiseError
from headwise.compat import CACHE
from headwise.kvcache import FULL, KVPolicy, policy_cache, streaming
from headwise.kvcache import layer as policy_layer
from test_kvcache import causal_lm, reference_logits

LONG, STEPS = 23, 30  # prompt and new tokens: windows of 3-6 wrap their ring many times


def ragged_batch(lengths: list[int], seed: int = 3) -> dict:
    """Left-padded ids ``[len(lengths), max(lengths)]`` and their attention mask."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, width - n:] = torch.randint(3, 90, (n,), generator=g)
        mask[row, width - n:] = 1
    return {"input_ids": ids, "attention_mask": mask}


def wide_policy(model) -> KVPolicy:
    """Layer 0: full, sink 2 + window 3 (alternating); layer 1: sink 3 + window 5, sink 0 + window 4."""
    shape = [len(layer) for layer in KVPolicy.uniform(model).heads]
    first = [FULL if h % 2 == 0 else streaming(2, 3) for h in range(shape[0])]
    second = [streaming(3, 5) if h % 2 == 0 else streaming(0, 4) for h in range(shape[1])]
    return KVPolicy((tuple(first), tuple(second)))


def greedy(model, inputs: dict, steps: int = STEPS, **kwargs):
    return model.generate(**inputs, max_new_tokens=steps, min_new_tokens=steps, do_sample=False, pad_token_id=0,
                          return_dict_in_generate=True, output_logits=True, **kwargs)


def assert_matches_reference(model, policy, inputs, out, atol=1e-4):
    prompt_len = inputs["input_ids"].shape[1]
    steps = len(out.logits)
    mask = torch.cat([inputs["attention_mask"], torch.ones(len(out.sequences), steps - 1, dtype=torch.long)], 1)
    ref = reference_logits(model, policy, out.sequences[:, :-1], mask)
    for step, logits in enumerate(out.logits):
        scale = ref[:, prompt_len - 1 + step].abs().max().item()
        torch.testing.assert_close(logits.float(), ref[:, prompt_len - 1 + step].float(), atol=atol * max(scale, 1),
                                   rtol=0)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("chunk", [None, 4])
def test_ring_buffers_that_wrap_equal_the_masked_dense_reference(family, chunk):
    model = causal_lm(family)
    inputs = ragged_batch([LONG, LONG - 7, LONG - 2])
    policy = wide_policy(model)
    headwise.apply_kv_policy(model, policy, prefill_chunk=chunk)
    out = greedy(model, inputs)
    assert_matches_reference(model, policy, inputs, out)
    for layer in out[CACHE].layers[1:]:  # fixed slots: sink + window + 1, however long the sequence
        assert [g.keys.shape[2] for g in layer.groups] == [g.rule.sink + g.rule.window + 1 for g in layer.groups]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_generation_equals_the_reference(dtype):
    model = causal_lm("llama")
    inputs = ragged_batch([LONG, LONG - 5])
    policy = wide_policy(model)
    headwise.apply_kv_policy(model, policy, prefill_chunk=5)
    model.to(dtype)
    out = greedy(model, inputs, steps=12)
    assert all(t.dtype == dtype for layer in out[CACHE].layers for t in layer.stored_tensors())
    assert_matches_reference(model, policy, inputs, out, atol=2e-2 if dtype == torch.float16 else 6e-2)


def test_chunked_prefill_equals_one_prefill_and_the_reference():
    model = causal_lm("llama")
    inputs = ragged_batch([LONG, LONG - 9])
    policy = wide_policy(model)
    headwise.apply_kv_policy(model, policy, prefill_chunk=None)
    whole = greedy(model, inputs, steps=8)
    for chunk in (1, 3, 7, 64):
        headwise.apply_kv_policy(model, policy, prefill_chunk=chunk)
        chunked = greedy(model, inputs, steps=8)
        assert torch.equal(chunked.sequences, whole.sequences), chunk
        for a, b in zip(chunked.logits, whole.logits):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert_matches_reference(model, policy, inputs, whole)


def test_generate_feeds_the_prompt_in_chunks_and_streaming_heads_never_hold_it():
    model = causal_lm("llama")
    inputs = ragged_batch([LONG])
    rule = streaming(2, 3)
    headwise.apply_kv_policy(model, KVPolicy.uniform(model, rule), prefill_chunk=5)
    lengths, keys_seen = [], []
    hook = model.register_forward_pre_hook(lambda m, a, k: lengths.append(k["input_ids"].shape[1]), with_kwargs=True)
    original = policy_layer._sdpa

    def spy(query, keys, *args):
        keys_seen.append(keys.shape[2])
        return original(query, keys, *args)

    policy_layer._sdpa = spy
    try:
        greedy(model, inputs, steps=3)
        # a generate() argument wins over the policy's chunk
        lengths_before = len(lengths)
        greedy(model, inputs, steps=3, prefill_chunk_size=10)
    finally:
        policy_layer._sdpa = original
        hook.remove()
    assert lengths[:lengths_before] == [5, 5, 5, 5, 3, 1, 1]
    assert lengths[lengths_before:] == [10, 10, 3, 1, 1]
    assert max(keys_seen) <= rule.sink + rule.window + 1 + 10  # held slots + one chunk, never the 23-token prompt


def test_batch_of_four_lengths_equals_one_by_one():
    model = causal_lm("llama", seed=4)
    lengths = [LONG, 9, LONG - 4, 15]
    batch = ragged_batch(lengths, seed=7)
    policy = wide_policy(model)
    headwise.apply_kv_policy(model, policy, prefill_chunk=6)
    together = greedy(model, batch, steps=20)
    for row, n in enumerate(lengths):
        alone_inputs = {k: v[row:row + 1, -n:] for k, v in batch.items()}
        alone = greedy(model, alone_inputs, steps=20)
        assert torch.equal(alone.sequences[0, n:], together.sequences[row, batch["input_ids"].shape[1]:]), row
        for a, b in zip(alone.logits, together.logits):
            torch.testing.assert_close(a[0], b[row], atol=1e-4, rtol=1e-4)


def test_padding_never_counts_toward_a_sink():
    """A row padded by more than the sink would see only padding as its sinks if slots counted; it must see its
    first real tokens, exactly as the same prompt without padding does."""
    model = causal_lm("llama", seed=2)
    policy = KVPolicy.uniform(model, streaming(2, 3))
    headwise.apply_kv_policy(model, policy, prefill_chunk=None)
    batch = ragged_batch([LONG, 8], seed=9)
    together = greedy(model, batch, steps=6)
    alone = greedy(model, {k: v[1:, -8:] for k, v in batch.items()}, steps=6)
    for a, b in zip(alone.logits, together.logits):
        torch.testing.assert_close(a[0], b[1], atol=1e-4, rtol=1e-4)
    assert_matches_reference(model, policy, batch, together)


def test_decoding_without_any_mask_once_the_ring_is_clean():
    model = causal_lm("llama")
    headwise.apply_kv_policy(model, KVPolicy.uniform(model, streaming(2, 3)), prefill_chunk=None)
    masks = []
    original = policy_layer._sdpa

    def spy(query, keys, values, mask, *args):
        masks.append((query.shape[2], keys.shape[2], mask is None))
        return original(query, keys, values, mask, *args)

    policy_layer._sdpa = spy
    try:
        greedy(model, ragged_batch([LONG]), steps=4)
    finally:
        policy_layer._sdpa = original
    decode = [m for m in masks if m[0] == 1]
    assert decode and all(k == 6 and no_mask for _, k, no_mask in decode)


def test_meta_device_chunks_and_wraps():
    model = causal_lm("llama", device="meta")
    headwise.apply_kv_policy(model, wide_policy(model))
    cache = policy_cache(model)
    ids = torch.zeros(2, LONG, dtype=torch.long, device="meta")
    with torch.no_grad():
        for start in range(0, LONG, 5):
            model(ids[:, start:start + 5], **{CACHE: cache}, use_cache=True)
        for _ in range(10):
            step = model(ids[:, :1], **{CACHE: cache}, use_cache=True).logits
    assert step.device.type == "meta" and step.shape == (2, 1, model.config.vocab_size)
    assert cache.get_seq_length() == LONG + 10
    groups = cache.layers[1].groups
    assert [g.keys.shape[2] for g in groups] == [9, 5] and all(g.keys.device.type == "meta" for g in groups)


@pytest.mark.parametrize("chunk", [0, -3, 2.5, True])
def test_a_bad_prefill_chunk_is_refused(chunk):
    model = causal_lm("llama")
    with pytest.raises(HeadwiseError, match="prefill_chunk"):
        headwise.apply_kv_policy(model, wide_policy(model), prefill_chunk=chunk)


@pytest.mark.slow
def test_smollm2_batch_of_four_lengths_equals_one_by_one():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from headwise.models import resolve_model

    path = resolve_model("smollm2-135m")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="headwise").eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    texts = ["The history of the city begins with a small fishing village on the river, where traders from the north "
             "came every summer to sell furs and buy salt, and over the centuries the village grew into a town.",
             "Photosynthesis turns light into chemical energy.",
             "In mathematics, a prime number is a natural number greater than one that has no divisors other than one "
             "and itself; the first few are two, three, five, seven and eleven.",
             "The recipe asks for flour, two eggs, a cup of milk and a pinch of salt, mixed until smooth."]
    full = {(l, h) for l in range(0, 30, 3) for h in range(3) if (l + h) % 2 == 0}
    headwise.apply_kv_policy(model, KVPolicy.keep_full(model, full, sink=4, window=12), prefill_chunk=16)
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    together = greedy(model, {k: batch[k] for k in ("input_ids", "attention_mask")}, steps=12)
    width = batch["input_ids"].shape[1]
    for row, text in enumerate(texts):
        alone = greedy(model, dict(tokenizer(text, return_tensors="pt")), steps=12)
        n = alone.sequences.shape[1] - 12
        assert torch.equal(alone.sequences[0, n:], together.sequences[row, width:]), row
