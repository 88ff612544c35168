"""Sink logits (kvcache.sink_logit): a streaming head's softmax with one extra zero-value logit per query head,
against a dense eager reference in float32, and the calibration against queries and keys rebuilt by hand."""

from __future__ import annotations

import pytest
import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

import headwise
from headwise import HeadwiseError
from headwise.compat import CACHE
from headwise.kvcache import FULL, KVPolicy, streaming
from headwise.kvcache.generation import sink_logits_of
from headwise.kvcache.sink_logit import sink_logit_cache, sink_logits
from test_kvcache import causal_lm

LENGTH, WINDOW = 23, 5
REFERENCE = "sink_logit_reference"
_STATE: dict = {}


def reference_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager softmax over the whole sequence: full heads causal; streaming heads (sink 0) see the ``WINDOW``
    previous keys and themselves plus one extra score column, their sink logit, whose value is zero."""
    rules, logits = _STATE["policy"].heads[module.layer_idx], _STATE["logits"][module.layer_idx].reshape(-1)
    group = query.shape[1] // key.shape[1]
    key, value = key.float().repeat_interleave(group, 1), value.float().repeat_interleave(group, 1)
    t = query.shape[2]
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    scores = (query.float() @ key.transpose(-1, -2)) * scaling  # [1, H, T, T]
    outs = []
    for h in range(query.shape[1]):
        rule = rules[h // group]
        ok = (j <= i) if rule.full else (j <= i) & (i - j <= rule.window)
        s = scores[:, h].masked_fill(~ok, float("-inf"))
        if not rule.full:
            s = torch.cat([s, torch.full((1, t, 1), float(logits[h]))], -1)
        probs = s.softmax(-1)[..., :t]  # the sink column's value is zero
        outs.append(probs @ value[:, h])
    return torch.stack(outs, 1).to(query.dtype).transpose(1, 2), None


AttentionInterface.register(REFERENCE, reference_attention)
AttentionMaskInterface.register(REFERENCE, sdpa_mask)


def policy_of_test(model) -> KVPolicy:
    """Layer 0: KV head 0 full, head 1 streaming(0, WINDOW); layer 1: both streaming."""
    return KVPolicy(((FULL, streaming(0, WINDOW)), (streaming(0, WINDOW),) * 2))


@pytest.mark.parametrize("chunk", [LENGTH, 4])
def test_cache_equals_dense_reference_with_a_sink_column(chunk):
    model = causal_lm("llama")  # 2 KV heads, 2 query heads each
    policy = policy_of_test(model)
    logits = torch.tensor([[[0.5, -1.0], [2.0, 0.0]], [[1.5, 3.0], [-0.5, 1.0]]])  # [L, Hkv, g]
    ids = torch.randint(3, 90, (1, LENGTH), generator=torch.Generator().manual_seed(3))
    headwise.apply_kv_policy(model, policy)
    cache = sink_logit_cache(policy, logits, LENGTH)
    with torch.no_grad():
        parts = [model(ids[:, s:s + chunk], use_cache=True, **{CACHE: cache}).logits
                 for s in range(0, LENGTH - 3, chunk)]
        parts += [model(ids[:, t:t + 1], use_cache=True, **{CACHE: cache}).logits
                  for t in range(max(range(0, LENGTH - 3, chunk)) + chunk, LENGTH)]
        ours = torch.cat(parts, 1)
        plain = model(ids, use_cache=True, **{CACHE: headwise.kvcache.PolicyCache(policy, length=LENGTH)}).logits
    headwise.remove_kv_policy(model)
    _STATE.update(policy=policy, logits=logits)
    model.set_attn_implementation(REFERENCE)
    with torch.no_grad():
        ref = model(ids, use_cache=False).logits
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    assert (plain - ref).abs().max() > 1e-2  # the sink logits change the answer


def test_calibration_equals_hand_computed_queries_and_keys():
    model = causal_lm("llama")
    sink = 2
    prompts = [torch.randint(3, 90, (LENGTH,), generator=torch.Generator().manual_seed(s)) for s in (1, 2)]
    got = {r: sink_logits(model, prompts, sink, WINDOW, reduce=r) for r in ("mean", "median")}
    attn0 = model.model.layers[0].self_attn
    d = attn0.head_dim
    seen = {}
    hooks = [layer.self_attn.register_forward_hook(
        lambda m, args, kwargs, out, i=i: seen.setdefault(i, []).append((kwargs["hidden_states"],
                                                                          kwargs["position_embeddings"])),
        with_kwargs=True) for i, layer in enumerate(model.model.layers)]
    try:
        with torch.no_grad():
            for ids in prompts:
                model(ids[None], use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    for layer, calls in seen.items():
        attn = model.model.layers[layer].self_attn
        lses = []
        for hidden, (cos, sin) in calls:
            q = attn.q_proj(hidden).view(1, LENGTH, -1, d).transpose(1, 2)
            k = attn.k_proj(hidden).view(1, LENGTH, -1, d).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
            scores = q[0, :, sink + WINDOW + 1:] @ k[0, :, :sink].transpose(-1, -2) * d ** -0.5
            lses.append(scores.logsumexp(-1))
        lse = torch.cat(lses, -1)
        torch.testing.assert_close(got["mean"][layer].reshape(-1), lse.mean(-1), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got["median"][layer].reshape(-1), lse.median(-1).values, atol=1e-5, rtol=1e-5)
    assert model.config._attn_implementation == "headwise"  # restored


def test_bad_calibration_is_refused():
    model = causal_lm("llama")
    with pytest.raises(HeadwiseError, match="longer than"):
        sink_logits(model, [torch.arange(5)], 2, WINDOW)
    with pytest.raises(HeadwiseError, match="reduce"):
        sink_logits(model, [torch.arange(30)], 2, WINDOW, reduce="max")


def test_generate_with_recorded_sink_logits_equals_the_reference():
    """``apply_kv_policy(..., sink_logits=)``: ``generate`` runs them (greedy tokens and logits of the dense
    reference), ``sink_logits_of`` returns them, and removing the policy forgets them."""
    model = causal_lm("llama")
    policy = policy_of_test(model)
    logits = torch.tensor([[[0.5, -1.0], [2.0, 0.0]], [[1.5, 3.0], [-0.5, 1.0]]])
    ids = torch.randint(3, 90, (1, LENGTH), generator=torch.Generator().manual_seed(4))
    headwise.apply_kv_policy(model, policy, prefill_chunk=4, sink_logits=logits)
    assert torch.equal(sink_logits_of(model), logits)
    out = model.generate(ids, max_new_tokens=6, do_sample=False, output_logits=True, return_dict_in_generate=True,
                         pad_token_id=0)
    headwise.remove_kv_policy(model)
    assert sink_logits_of(model) is None
    _STATE.update(policy=policy, logits=logits)
    model.set_attn_implementation(REFERENCE)
    with torch.no_grad():
        ref = model(out.sequences[:, :-1], use_cache=False).logits
    for step, step_logits in enumerate(out.logits):
        torch.testing.assert_close(step_logits, ref[:, LENGTH - 1 + step], atol=1e-5, rtol=1e-5)


def test_bad_sink_logits_are_refused():
    model = causal_lm("llama")
    with pytest.raises(HeadwiseError, match=r"\[2, 2, 2\]"):
        headwise.apply_kv_policy(model, policy_of_test(model), sink_logits=torch.zeros(2, 2, 3))
