"""Per-head KV cache policies against the default cache and an independent masked dense reference."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as tf
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

import headwise
from headwise import HeadwiseError
from headwise.compat import CACHE
from headwise.kvcache import FULL, KVPolicy, policy_cache, policy_of, streaming
from headwise.runtime.attention import GROUPED_KV
from tiny import _cfg, tiny_model

FAMILIES = ["llama", "mistral", "qwen2", "gpt2"]
PROMPT, NEW = 11, 7


def causal_lm(family: str, seed: int = 0, device: str | None = None) -> tf.PreTrainedModel:
    """A tiny random ``…ForCausalLM`` with sharper attention than the default init (so masks matter)."""
    torch.manual_seed(seed)
    config = _cfg(family)
    if device == "meta":
        with torch.device("meta"):
            return tf.AutoModelForCausalLM.from_config(config, attn_implementation="headwise").eval()
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="headwise").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(k in name for k in ("q_proj.weight", "k_proj.weight", "c_attn.weight")):
                p.normal_(0.0, 0.5)
    return model


def prompt(batch: int = 2, seed: int = 1) -> dict:
    """Token ids ``[batch, PROMPT]``; row 1 is left-padded by 3 (as generation batches are)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 90, (batch, PROMPT), generator=g)
    mask = torch.ones_like(ids)
    if batch > 1:
        mask[1, :3] = 0
        ids[1, :3] = 0
    return {"input_ids": ids, "attention_mask": mask}


def mixed_policy(model) -> KVPolicy:
    """Layer 0: head 0 full, others sink 2 + window 3; layer 1: every head sink 1 + window 4 (or 0 + 5)."""
    shape = [len(layer) for layer in KVPolicy.uniform(model).heads]
    first = [FULL] + [streaming(2, 3)] * (shape[0] - 1)
    second = [streaming(1, 4) if h % 2 == 0 else streaming(0, 5) for h in range(shape[1])]
    return KVPolicy((tuple(first), tuple(second)))


def generate(model, inputs, **kwargs):
    return model.generate(**inputs, max_new_tokens=NEW, do_sample=False, pad_token_id=0,
                          return_dict_in_generate=True, output_logits=True, **kwargs)


# --- the masked dense reference: eager softmax with a per-head mask, whole sequence, no cache ---------------------

REFERENCE = "kv_reference"
_REFERENCE_POLICY: dict[str, KVPolicy] = {}


def reference_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    policy = _REFERENCE_POLICY["policy"]
    rules = policy.heads[module.layer_idx]
    group = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)
    t = query.shape[2]
    i = torch.arange(t)[:, None]
    j = torch.arange(t)[None, :]
    rows = []
    for pad in _REFERENCE_POLICY["pads"]:  # sinks are each row's first real tokens (after its left padding)
        allowed = []
        for h in range(query.shape[1]):
            rule = rules[h // group]
            ok = j <= i
            if not rule.full:
                ok = ok & ((j - pad < rule.sink) | (i - j <= rule.window))
            allowed.append(ok)
        rows.append(torch.stack(allowed))
    allowed = torch.stack(rows)  # [B, H, T, T]
    if attention_mask is not None:
        allowed = allowed & attention_mask[..., :t]
    allowed = allowed | ~allowed.any(-1, keepdim=True)
    scores = (query.float() @ key.float().transpose(-1, -2)) * (scaling or query.shape[-1] ** -0.5)
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return (probs @ value.float()).to(query.dtype).transpose(1, 2), None


AttentionInterface.register(REFERENCE, reference_attention)
AttentionMaskInterface.register(REFERENCE, sdpa_mask)


def reference_logits(model, policy: KVPolicy, sequences: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    _REFERENCE_POLICY["policy"] = policy
    _REFERENCE_POLICY["pads"] = (mask.cumsum(-1) == 0).sum(-1).tolist()  # left padding of each row
    model.set_attn_implementation(REFERENCE)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)  # as generate numbers left-padded rows
    try:
        with torch.no_grad():
            return model(input_ids=sequences, attention_mask=mask, position_ids=positions, use_cache=False).logits
    finally:
        model.set_attn_implementation("headwise")


# --- tests ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_all_full_equals_default_cache(family):
    model, inputs = causal_lm(family), prompt()
    default = generate(model, inputs)
    headwise.apply_kv_policy(model, KVPolicy.uniform(model))
    policied = generate(model, inputs)
    assert type(policied[CACHE]).__name__ == "PolicyCache"
    assert torch.equal(default.sequences, policied.sequences)
    for a, b in zip(default.logits, policied.logits):
        assert torch.equal(a, b)


@pytest.mark.parametrize("family", FAMILIES)
def test_window_covering_the_sequence_equals_full(family):
    model, inputs = causal_lm(family), prompt()
    default = generate(model, inputs)
    headwise.apply_kv_policy(model, KVPolicy.uniform(model, streaming(1, PROMPT + NEW)))
    policied = generate(model, inputs)
    assert torch.equal(default.sequences, policied.sequences)
    for a, b in zip(default.logits, policied.logits):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_generation_equals_masked_dense_reference(family):
    model, inputs = causal_lm(family), prompt()
    policy = mixed_policy(model)
    default = generate(model, inputs)
    headwise.apply_kv_policy(model, policy)
    out = generate(model, inputs)
    assert not torch.equal(default.sequences, out.sequences) or not all(
        torch.allclose(a, b, atol=1e-3) for a, b in zip(default.logits, out.logits)), "the policy changed nothing"
    full_mask = torch.cat([inputs["attention_mask"], torch.ones(2, NEW - 1, dtype=torch.long)], 1)
    ref = reference_logits(model, policy, out.sequences[:, :-1], full_mask)
    for step, logits in enumerate(out.logits):
        torch.testing.assert_close(logits, ref[:, PROMPT - 1 + step], atol=1e-4, rtol=1e-4)
        assert torch.equal(out.sequences[:, PROMPT + step], ref[:, PROMPT - 1 + step].argmax(-1))


def test_chunked_prefill_equals_one_prefill():
    model, inputs = causal_lm("llama"), prompt(batch=1)
    policy = headwise.apply_kv_policy(model, mixed_policy(model)) and policy_of(model)
    ids = inputs["input_ids"]
    with torch.no_grad():
        whole = model(ids, **{CACHE: policy_cache(model)}, use_cache=True).logits
        cache = policy_cache(model)
        parts = [model(ids[:, :4], **{CACHE: cache}, use_cache=True).logits]
        for t in range(4, PROMPT):
            parts.append(model(ids[:, t:t + 1], **{CACHE: cache}, use_cache=True).logits)
    torch.testing.assert_close(torch.cat(parts, 1), whole, atol=1e-5, rtol=1e-5)
    ref = reference_logits(model, policy, ids, torch.ones_like(ids))
    torch.testing.assert_close(whole, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_stored_bytes_are_the_buffers_counted_by_hand(family):
    model, inputs = causal_lm(family), prompt()
    policy = mixed_policy(model)
    headwise.apply_kv_policy(model, policy)
    cache = generate(model, inputs)[CACHE]
    seen = cache.get_seq_length()
    assert seen == PROMPT + NEW - 1
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    # by hand: layer 0's full head 0 took the 11-token prompt in 11 slots and grew once by 11 when decoding began
    # (22 >= 17 tokens) — unless it is the layer's only head (qwen2): then the layer is the default cache's (17);
    # a streaming head holds sink + window + 1 slots (2 + 3 + 1, 1 + 4 + 1, 0 + 5 + 1)
    heads = policy.kv_heads
    slots = (22 if heads[0] > 1 else seen) + (heads[0] - 1) * 6 + heads[1] * 6
    assert cache.stored_bytes() == 2 * 2 * head_dim * 4 * slots
    assert cache.stored_bytes() < KVPolicy.uniform(model).kv_bytes(seen, head_dim, 4, 2)
    # the tokens the policy keeps (17 on the full head, 5 per streaming head) fit those slots
    assert policy.stored_tokens(seen) == seen + (heads[0] - 1) * 5 + heads[1] * 5 <= slots
    # nothing else stays alive: no layer keeps the keys of its last forward
    for layer in cache.layers:
        assert not any(hasattr(v, GROUPED_KV) for v in vars(layer).values())


def test_prefill_keys_are_released():
    model, inputs = causal_lm("llama"), prompt(batch=1)
    headwise.apply_kv_policy(model, KVPolicy.uniform(model, streaming(1, 2)))
    cache = policy_cache(model)
    with torch.no_grad():
        model(**inputs, **{CACHE: cache}, use_cache=True)
    for layer in cache.layers:
        assert not any(hasattr(v, GROUPED_KV) for v in vars(layer).values())
        assert all(g.keys.shape[2] == 4 for g in layer.groups)
    assert cache.stored_bytes() == 2 * 2 * 2 * 8 * 4 * 4  # layers x K,V x KV heads x head_dim x fp32 x 1 + 2 + 1 slots


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_half_precision_matches_float32(family, dtype):
    model, inputs = causal_lm(family), prompt()
    headwise.apply_kv_policy(model, mixed_policy(model))
    ids = inputs["input_ids"]
    with torch.no_grad():
        ref = model(**inputs, **{CACHE: policy_cache(model)}, use_cache=True).logits
        model.to(dtype)
        cache = policy_cache(model)
        half = model(**inputs, **{CACHE: cache}, use_cache=True).logits
        step = model(ids[:, -1:], attention_mask=torch.ones(2, PROMPT + 1, dtype=torch.long),
                     **{CACHE: cache}, use_cache=True).logits
    assert half.dtype == dtype and step.dtype == dtype
    heads = policy_of(model).kv_heads  # the full head: 11 slots, grown to 22 by the step; streaming heads 6 each
    assert cache.stored_bytes() == 2 * 2 * 8 * 2 * (22 + (heads[0] - 1) * 6 + heads[1] * 6)
    real = inputs["attention_mask"].bool()
    tol = 2e-2 if dtype == torch.float16 else 8e-2
    torch.testing.assert_close(half.float()[real], ref[real], atol=tol * ref.abs().max().item(), rtol=0)


def test_meta_device():
    model = causal_lm("llama", device="meta")
    headwise.apply_kv_policy(model, mixed_policy(model))
    ids = torch.zeros(2, PROMPT, dtype=torch.long, device="meta")
    cache = policy_cache(model)
    with torch.no_grad():
        out = model(ids, **{CACHE: cache}, use_cache=True).logits
        step = model(ids[:, :1], **{CACHE: cache}, use_cache=True).logits
    assert out.device.type == "meta" and out.shape == (2, PROMPT, model.config.vocab_size)
    assert step.shape == (2, 1, model.config.vocab_size)
    layer = cache.layers[1]
    assert all(g.keys.device.type == "meta" and g.keys.shape[2] == 6 for g in layer.groups)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_save_and_reload_keep_the_policy(tmp_path, family):
    model, inputs = causal_lm(family), prompt()
    policy = mixed_policy(model)
    headwise.apply_kv_policy(model, policy)
    before = generate(model, inputs).sequences
    headwise.save_pretrained(model, tmp_path / "m")
    assert json.loads((tmp_path / "m" / "config.json").read_text())["headwise"]["journal"][-1]["method"] == "kv_policy"
    loaded = headwise.from_pretrained(tmp_path / "m")
    assert policy_of(loaded) == policy
    after = generate(loaded, inputs)
    assert type(after[CACHE]).__name__ == "PolicyCache"
    assert torch.equal(before, after.sequences)


def test_policy_file_round_trip_and_remove(tmp_path):
    model, inputs = causal_lm("qwen2"), prompt()
    default = generate(model, inputs).sequences
    policy = mixed_policy(model)
    policy.save(tmp_path / "policy.json")
    assert KVPolicy.load(tmp_path) == policy
    headwise.apply_kv_policy(model, tmp_path / "policy.json")
    assert policy_of(model) == policy
    headwise.remove_kv_policy(model)
    assert policy_of(model) is None
    out = generate(model, inputs)
    assert type(out[CACHE]).__name__ == "DynamicCache"
    assert torch.equal(out.sequences, default)


def test_explicit_cache_is_left_alone():
    model, inputs = causal_lm("llama"), prompt()
    headwise.apply_kv_policy(model, mixed_policy(model))
    out = generate(model, inputs, **{CACHE: tf.DynamicCache(config=model.config)})
    assert type(out[CACHE]).__name__ == "DynamicCache"


def test_beam_search_runs_with_a_policy():
    model, inputs = causal_lm("llama"), prompt()
    default = model.generate(**inputs, max_new_tokens=NEW, num_beams=3, do_sample=False, pad_token_id=0)
    headwise.apply_kv_policy(model, KVPolicy.uniform(model, streaming(1, PROMPT + NEW)))
    covered = model.generate(**inputs, max_new_tokens=NEW, num_beams=3, do_sample=False, pad_token_id=0)
    assert torch.equal(default, covered)


def _untouched(model) -> bool:
    return policy_of(model) is None and "_prepare_cache_for_generation" not in model.__dict__


@pytest.mark.parametrize("make_bad", [
    lambda m: KVPolicy(((FULL, FULL),)),                                        # one layer short
    lambda m: KVPolicy(((FULL,) * 3, (FULL,) * 2)),                            # a head too many in layer 0
    lambda m: KVPolicy.from_dict({"format": "headwise-kv-policy", "heads": [["full", "full"], ["full", "ful"]]}),
    lambda m: KVPolicy.from_dict({"heads": [["full"]]}),                        # not a policy file
    lambda m: KVPolicy.uniform(m, streaming(2, 0)),                             # empty window
    lambda m: KVPolicy.uniform(m, streaming(-1, 4)),
    lambda m: KVPolicy.keep_full(m, {(2, 0)}, 4, 8),                            # layer out of range
    lambda m: "/nonexistent/policy.json",
])
def test_bad_policies_are_refused_and_change_nothing(make_bad):
    model = causal_lm("llama")
    state = json.dumps(getattr(model.config, "headwise", None))
    with pytest.raises(HeadwiseError):
        headwise.apply_kv_policy(model, make_bad(model))
    assert _untouched(model) and json.dumps(getattr(model.config, "headwise", None)) == state


def test_encoders_are_refused():
    model = tiny_model("bert")
    with pytest.raises(HeadwiseError, match="decoder-only"):
        KVPolicy.uniform(model)
    assert policy_of(model) is None


def test_policy_for_a_pruned_model_is_refused_on_the_original(tmp_path):
    model = causal_lm("llama")
    wide = KVPolicy.uniform(model, streaming(1, 4))
    (tmp_path / "p.json").write_text(json.dumps({**wide.to_dict(), "heads": [["full"], ["full"]]}))
    with pytest.raises(HeadwiseError, match="does not fit"):
        headwise.apply_kv_policy(model, tmp_path / "p.json")
    assert _untouched(model)


def test_kv_fraction():
    policy = KVPolicy(((FULL, streaming(4, 60)), (streaming(4, 60), streaming(4, 60))))
    assert policy.stored_tokens(1000) == 1000 + 3 * 64
    assert policy.kv_fraction(1000) == pytest.approx((1000 + 192) / 4000)
    assert policy.stored_tokens(10) == 40
    assert policy.describe().startswith("1/4 KV heads full")
