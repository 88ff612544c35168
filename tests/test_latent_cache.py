"""``LatentCache``: a latent-converted model's ``generate()`` holds the latent per token, never decoded keys/values,
and decodes what the ordinary dynamic cache decodes on the same converted model."""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from transformers.cache_utils import DynamicCache

import headwise
from headwise.conversion import LatentCache, convert_latent, kv_values_per_token, latent_cache
from headwise.conversion.cache import GROW, LatentLayer
from headwise.errors import HeadwiseError
from headwise.kvcache import KVPolicy, apply_kv_policy, remove_kv_policy
from tiny import VOCAB, _cfg


def latent_lm(family: str = "llama", rope_pairs: int = 1, dtype: torch.dtype = torch.float32, seed: int = 0,
              device: str | None = None) -> tf.PreTrainedModel:
    """A tiny random causal LM with sharp attention, converted to latent keys/values at half the cache."""
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(_cfg(family), attn_implementation="sdpa").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "q_proj.weight" in name or "k_proj.weight" in name:
                p.normal_(0.0, 0.5)
    convert_latent(model, kv_budget=0.5, rope_pairs=rope_pairs, init="svd", progress=False)
    return model.to(device or "cpu", dtype)


def prompts(batch: int = 1, length: int = 21, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, T]`` ids and a left-padding mask (row ``b`` has ``4·b`` pad tokens)."""
    ids = torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    for b in range(batch):
        mask[b, :4 * b] = 0
    return ids.masked_fill(mask == 0, 0), mask


def run(model, ids, mask, cache=None, new=10, **kwargs):
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                              pad_token_id=0, output_logits=True, return_dict_in_generate=True,
                              **({} if cache is None else {"cache": cache}), **kwargs)


def same_as_dynamic(model, ids, mask, atol: float, **kwargs):
    ref = run(model, ids, mask, cache=DynamicCache(config=model.config), **kwargs)
    got = run(model, ids, mask, **kwargs)
    assert isinstance(got.past_key_values, LatentCache)
    assert torch.equal(got.sequences, ref.sequences)
    torch.testing.assert_close(torch.stack(got.logits), torch.stack(ref.logits), rtol=0, atol=atol)
    return got


@pytest.mark.parametrize("family,rope_pairs", [("llama", 0), ("llama", 2), ("qwen2", 1)])
def test_generate_equals_the_dynamic_cache(family, rope_pairs):
    model = latent_lm(family, rope_pairs)
    ids, mask = prompts()
    same_as_dynamic(model, ids, mask, atol=1e-5)
    same_as_dynamic(model, ids, mask, atol=1e-5, prefill_chunk_size=6)  # held keys/values decoded in prefill


def test_left_padded_batch_equals_the_dynamic_cache_and_one_by_one():
    model = latent_lm("llama", 1)
    ids, mask = prompts(batch=3)
    got = same_as_dynamic(model, ids, mask, atol=1e-5)
    for b in range(3):
        real = mask[b].bool()
        alone = run(model, ids[b:b + 1, real], mask[b:b + 1, real])
        assert torch.equal(alone.sequences[0, -10:], got.sequences[b, -10:])


def test_bytes_held_are_the_latent_and_rotary_rows():
    model = latent_lm("llama", 1)
    ids, mask = prompts(length=40)
    cache = run(model, ids, mask, new=30).past_key_values
    layers = [layer for layer in cache.layers if isinstance(layer, LatentLayer)]
    assert len(layers) == model.config.num_hidden_layers
    tokens = cache.get_seq_length()
    assert tokens == 69
    slots = layers[0].latent.shape[1]
    assert tokens <= slots < tokens + min(tokens, GROW)  # spare slots of the growing buffer
    assert all(layer.latent.shape[1] == slots and layer.rope.shape[2] == slots for layer in layers)
    # per slot exactly what kv_values_per_token counts: rank + rotary rows per layer, nothing decoded
    assert cache.stored_bytes() == kv_values_per_token(model) * 4 * slots
    full = run(model, ids, mask, cache=DynamicCache(config=model.config), new=30).past_key_values
    full_bytes = sum(t.untyped_storage().nbytes() for layer in full.layers for t in (layer.keys, layer.values))
    assert full_bytes == 2 * kv_values_per_token(model) * 4 * tokens  # the latent is half the full cache


@pytest.mark.parametrize("dtype,atol", [(torch.float16, 2e-2), (torch.bfloat16, 1e-1)])
def test_low_precision_logits_close(dtype, atol):
    model = latent_lm("llama", 1, dtype=dtype)
    ids, mask = prompts(batch=2)
    seq = run(model, ids, mask, cache=DynamicCache(config=model.config), new=6).sequences
    mask = torch.cat([mask, mask.new_ones(2, 6)], 1)
    outs = []
    with torch.no_grad():  # the same tokens through both caches, one step at a time: every step's logits
        for cache in (DynamicCache(config=model.config), latent_cache(model)):
            cut = ids.shape[1]
            logits = [model(seq[:, :cut], attention_mask=mask[:, :cut], cache=cache, use_cache=True).logits[:, -1]]
            for t in range(cut, seq.shape[1]):
                logits.append(model(seq[:, t:t + 1], attention_mask=mask[:, :t + 1], cache=cache,
                                    use_cache=True).logits[:, -1])
            outs.append(torch.stack(logits).float())
    assert outs[0].isfinite().all()
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=atol)


def test_meta_device_shapes():
    model = latent_lm("llama", 1, device="meta")
    ids = torch.zeros(2, 9, dtype=torch.long, device="meta")
    cache = latent_cache(model)
    with torch.no_grad():
        out = model(ids, cache=cache, use_cache=True)
        out = model(ids[:, :1], cache=cache, use_cache=True)
    assert out.logits.shape == (2, 1, VOCAB) and cache.get_seq_length() == 10
    assert cache.layers[0].latent.shape[:2] == (2, 9 + min(9, GROW))  # grew once, by the tokens it held


def test_survives_save_and_reload(tmp_path):
    model = latent_lm("llama", 1)
    ids, mask = prompts(batch=2)
    ref = run(model, ids, mask)
    headwise.save_pretrained(model, tmp_path / "m")
    back = headwise.from_pretrained(tmp_path / "m").eval()
    got = run(back, ids, mask)
    assert isinstance(got.past_key_values, LatentCache)
    assert torch.equal(got.sequences, ref.sequences)


def test_a_kv_policy_takes_precedence_and_gives_the_latent_cache_back():
    model = latent_lm("llama", 1)
    ids, mask = prompts()
    apply_kv_policy(model, KVPolicy.uniform(model))
    assert not isinstance(run(model, ids, mask, new=2).past_key_values, LatentCache)
    remove_kv_policy(model)
    assert isinstance(run(model, ids, mask, new=2).past_key_values, LatentCache)


def test_refusals():
    plain = tf.AutoModelForCausalLM.from_config(_cfg("llama"), attn_implementation="headwise").eval()
    with pytest.raises(HeadwiseError, match="no latent key/value site"):
        latent_cache(plain)
    model = latent_lm("llama", 1)
    other = latent_lm("llama", 1, seed=1)
    ids, _ = prompts()
    foreign = latent_cache(other)  # built for another model: never receives this model's latents
    with pytest.raises(HeadwiseError, match="did not receive this layer's latent"), torch.no_grad():
        model(ids, cache=foreign, use_cache=True)
    older, newer = latent_cache(model), latent_cache(model)  # two caches of one model: each works
    with torch.no_grad():
        model(ids, cache=older, use_cache=True)
        model(ids, cache=newer, use_cache=True)
    assert older.get_seq_length() == newer.get_seq_length() == ids.shape[1]


def test_beam_search_equals_the_dynamic_cache():
    """Beam search reorders the latents and rotary rows of every layer."""
    model = latent_lm("llama", 1)
    ids, mask = prompts(batch=2)
    same_as_dynamic(model, ids, mask, atol=1e-4, num_beams=3)
