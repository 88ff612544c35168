"""The compileable per-head cache: ``generate(cache_implementation="static")`` under a KV policy preallocates every
buffer and runs the decoding step under ``torch.compile(fullgraph=True)`` through transformers' own compile path,
with the tokens of eager decoding and no recompilation as the cache fills."""

from __future__ import annotations

import pytest
import torch
from transformers import CompileConfig

import headwise
from headwise import HeadwiseError
from headwise.compat import CACHE
from headwise.kvcache import FULL, KVPolicy, policy_cache, streaming
from headwise.kvcache.static import StaticPolicyLayer
from test_kvcache import causal_lm
from test_kvcache_runtime import assert_matches_reference, greedy, ragged_batch


def mixed(model) -> KVPolicy:
    """Layer 0: full + sink 2 / window 3; layer 1: a window scaling to 4 at 12 tokens + sink 0 / window 5."""
    return KVPolicy(((FULL, streaming(2, 3)), (streaming(1, 4, context=12), streaming(0, 5))))


GRAPHS: list = []  # every graph dynamo hands to the counting backend


def counting_backend(graph: torch.fx.GraphModule, example_inputs: list) -> object:
    """Runs the captured graph eagerly and records it (a function: transformers deep-copies its compile config)."""
    GRAPHS.append(graph)
    return graph.forward


def compile_config(backend) -> CompileConfig:
    config = CompileConfig(fullgraph=True, backend=backend, mode=None if callable(backend) else "default")
    config._compile_all_devices = True  # transformers compiles generate's step on CUDA only unless asked
    return config


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_a_static_policy_cache_equals_the_dynamic_one_and_the_reference():
    model = causal_lm("llama")
    policy = mixed(model)
    headwise.apply_kv_policy(model, policy, prefill_chunk=4)
    inputs = ragged_batch([23, 16, 21, 9])
    dynamic = greedy(model, inputs)
    static = greedy(model, inputs, cache_implementation="static")
    cache = static[CACHE]
    assert cache.is_compileable and isinstance(cache.layers[1], StaticPolicyLayer)
    assert torch.equal(dynamic.sequences, static.sequences)
    for a, b in zip(dynamic.logits, static.logits):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert_matches_reference(model, policy, inputs, static)


def test_the_compiled_step_gives_eager_tokens_without_recompiling_over_200_steps():
    model = causal_lm("llama")
    headwise.apply_kv_policy(model, mixed(model), prefill_chunk=None)
    inputs = ragged_batch([17, 11, 14, 6])  # batch 4, left-padded
    eager = greedy(model, inputs, steps=200, cache_implementation="static")
    GRAPHS.clear()
    compiled = greedy(model, inputs, steps=200, cache_implementation="static",
                      compile_config=compile_config(counting_backend))
    assert torch.equal(eager.sequences, compiled.sequences)
    assert len(GRAPHS) == 1  # one graph (fullgraph=True: no break), compiled once for all 199 steps
    again = greedy(model, ragged_batch([9], seed=5), steps=20, cache_implementation="static",
                   compile_config=compile_config(counting_backend))
    assert again.sequences.shape == (1, 29)
    assert len(GRAPHS) <= 2  # another batch size may compile once more, never once per step


def test_a_compiled_prefill_in_512_token_chunks_gives_the_eager_tokens():
    """The CPU's default chunk: transformers compiles each prefill chunk too, so the chunk's writes and masks
    must not branch on tensor values (they did: "Could not guard on data-dependent expression 512 < u0 + 4")."""
    model = causal_lm("llama")
    policy = mixed(model)
    headwise.apply_kv_policy(model, policy, prefill_chunk=512)
    inputs = ragged_batch([530, 521])  # two chunks: 512 tokens, then 18; row 1 left-padded by 9
    dynamic = greedy(model, inputs, steps=6)
    GRAPHS.clear()
    compiled = greedy(model, inputs, steps=6, cache_implementation="static",
                      compile_config=compile_config(counting_backend))
    assert torch.equal(dynamic.sequences, compiled.sequences)
    assert len(GRAPHS) == 3  # the 512-token chunk, the 18-token chunk, the one-token step: fullgraph, no break
    assert_matches_reference(model, policy, inputs, compiled)


def test_inductor_compiles_the_step_to_the_eager_tokens():
    model = causal_lm("llama")
    headwise.apply_kv_policy(model, mixed(model), prefill_chunk=None)
    inputs = ragged_batch([12])
    eager = greedy(model, inputs, steps=12, cache_implementation="static")
    compiled = greedy(model, inputs, steps=12, cache_implementation="static", compile_config=compile_config("inductor"))
    assert torch.equal(eager.sequences, compiled.sequences)


def test_a_prompt_longer_than_the_static_cache_is_refused():
    model = causal_lm("llama")
    headwise.apply_kv_policy(model, mixed(model))
    cache = policy_cache(model, max_cache_len=8)
    with pytest.raises(HeadwiseError, match="max_cache_len=8"):
        model(torch.ones(1, 9, dtype=torch.long), **{CACHE: cache}, use_cache=True)
    with pytest.raises(HeadwiseError, match="max_cache_len"):
        policy_cache(model, max_cache_len=0)


def test_static_buffers_keep_their_addresses_across_a_reset():
    model = causal_lm("llama")
    headwise.apply_kv_policy(model, mixed(model))
    cache = policy_cache(model, max_cache_len=32)
    ids = ragged_batch([10, 7])
    with torch.no_grad():
        model(**ids, **{CACHE: cache}, use_cache=True)
    layer = cache.layers[1]
    addresses = [t.data_ptr() for t in layer.stored_tensors()] + [layer.pads.data_ptr()]
    assert layer.pads.tolist() == [0, 3] and int(layer.get_seq_length()) == 10
    cache.reset()
    assert [t.data_ptr() for t in layer.stored_tensors()] + [layer.pads.data_ptr()] == addresses
    assert int(layer.get_seq_length()) == 0 and not any(t.any() for t in layer.stored_tensors())
