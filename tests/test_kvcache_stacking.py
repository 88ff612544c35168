"""Per-head KV policies through plain forward calls (``policy_forward``) and on converted models: a grouped-query
conversion takes a policy for its new heads; a latent conversion takes one rule per layer and refuses per-head ones."""

from __future__ import annotations

import json

import pytest
import torch

import headwise
from headwise import HeadwiseError
from headwise.compat import CACHE
from headwise.conversion import convert_gqa, convert_latent
from headwise.kvcache import FULL, KVPolicy, kv_policy, policy_forward, policy_of, streaming
from headwise.kvcache.scores import HeadScores
from test_kvcache import NEW, PROMPT, _untouched, causal_lm, generate, mixed_policy, prompt, reference_logits


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_policy_forward_equals_masked_dense_reference(family):
    model = causal_lm(family)
    ids = torch.randint(3, 90, (2, 17), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        plain = model(input_ids=ids).logits
    policy = mixed_policy(model)
    with policy_forward(model, policy), torch.no_grad():
        through = model(input_ids=ids).logits
    ref = reference_logits(model, policy, ids, mask)
    torch.testing.assert_close(through, ref, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(through, plain, atol=1e-3), "the policy changed nothing"
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, plain, atol=0, rtol=0)  # the hook is gone
    with policy_forward(model, KVPolicy.uniform(model)), torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, plain, atol=1e-5, rtol=1e-5)


def test_policy_forward_refuses_a_model_without_policy_or_a_wrong_one():
    model = causal_lm("llama")
    with pytest.raises(HeadwiseError, match="no KV policy"):
        with policy_forward(model):
            pass
    with pytest.raises(HeadwiseError, match="does not fit"):
        with policy_forward(model, KVPolicy(((FULL,),))):
            pass
    assert not model._forward_pre_hooks and _untouched(model)


def test_grouped_query_conversion_takes_a_policy_for_its_new_heads():
    model, inputs = causal_lm("llama"), prompt()
    before = mixed_policy(model)  # 2 KV heads per layer
    convert_gqa(model, kv_heads=1, init="mean")
    state = json.dumps(getattr(model.config, "headwise", None))
    with pytest.raises(HeadwiseError, match="does not fit"):
        headwise.apply_kv_policy(model, before)
    assert _untouched(model) and json.dumps(getattr(model.config, "headwise", None)) == state
    policy = KVPolicy(((FULL,), (streaming(1, 4),)))
    headwise.apply_kv_policy(model, policy)
    out = generate(model, inputs)
    full_mask = torch.cat([inputs["attention_mask"], torch.ones(2, NEW - 1, dtype=torch.long)], 1)
    ref = reference_logits(model, policy, out.sequences[:, :-1], full_mask)
    for step, logits in enumerate(out.logits):
        torch.testing.assert_close(logits, ref[:, PROMPT - 1 + step], atol=1e-4, rtol=1e-4)
    # one KV head per layer now: layer 0 holds every token (the default cache's layer), layer 1 sink 1 + window 4
    # in 1 + 4 + 1 slots
    seen = out[CACHE].get_seq_length()
    assert out[CACHE].stored_bytes() == 2 * 2 * 8 * 4 * (seen + 6)


def latent_model():
    model = causal_lm("llama")
    convert_latent(model, kv_budget=0.5, init="svd")
    return model


def test_latent_model_refuses_per_head_rules_and_takes_per_layer_ones():
    model, inputs = latent_model(), prompt()
    state = json.dumps(getattr(model.config, "headwise", None))
    latent_hook = model.__dict__["_prepare_cache_for_generation"]  # generate() holds the latent (LatentCache)
    with pytest.raises(HeadwiseError, match="shared by their KV heads"):
        headwise.apply_kv_policy(model, mixed_policy(model))
    assert policy_of(model) is None and model.__dict__["_prepare_cache_for_generation"] is latent_hook
    assert json.dumps(getattr(model.config, "headwise", None)) == state
    policy = KVPolicy(((FULL, FULL), (streaming(1, 4), streaming(1, 4))))
    headwise.apply_kv_policy(model, policy)
    out = generate(model, inputs)
    full_mask = torch.cat([inputs["attention_mask"], torch.ones(2, NEW - 1, dtype=torch.long)], 1)
    ref = reference_logits(model, policy, out.sequences[:, :-1], full_mask)
    for step, logits in enumerate(out.logits):
        torch.testing.assert_close(logits, ref[:, PROMPT - 1 + step], atol=1e-4, rtol=1e-4)


def test_kv_policy_keeps_whole_layers_on_a_latent_model():
    model = latent_model()
    # layer 1 holds the best-ranked KV head: it stays full, layer 0 streams (a budget for one full layer of two)
    scores = HeadScores({"retrieval": torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.0, 0.9, 0.0, 0.0]])}, [2, 2])
    policy, _ = kv_policy(model, None, kv_budget=0.6, context=100, sink=1, window=9, ranking="retrieval",
                          scores=scores)
    assert policy.heads == ((streaming(1, 9, context=100),) * 2, (FULL, FULL))  # the window scales by default
    plain, _ = kv_policy(causal_lm("llama"), None, kv_budget=0.6, context=100, sink=1, window=9,
                         ranking="retrieval", scores=scores)
    assert plain.full_heads() == [(0, 1), (1, 0)]  # per head on the unconverted model (2 of 4 fit)
    headwise.apply_kv_policy(model, policy)
    assert policy_of(model) == policy


def test_a_reloaded_latent_model_keeps_its_per_layer_policy_and_refuses_per_head_ones(tmp_path):
    model, inputs = latent_model(), prompt()
    policy = KVPolicy(((streaming(1, 4),) * 2, (FULL, FULL)))
    headwise.apply_kv_policy(model, policy)
    headwise.save_pretrained(model, tmp_path / "m")
    back = headwise.from_pretrained(tmp_path / "m").eval()
    assert policy_of(back) == policy
    torch.testing.assert_close(generate(back, inputs).logits[-1], generate(model, inputs).logits[-1])
    with pytest.raises(HeadwiseError, match="shared by their KV heads"):
        headwise.apply_kv_policy(back, mixed_policy(back))
    assert policy_of(back) == policy
