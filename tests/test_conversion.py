"""KV-cache conversion: grouped-query merging and latent keys/values (headwise.conversion)."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as tf
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

import headwise
from headwise.conversion import (LatentProjection, convert_gqa, convert_latent, kv_values_per_token,
                                 pair_scale)
from headwise.conversion.rotary import conjugate_rows, to_complex, to_real
from headwise.errors import HeadwiseError
from tiny import VOCAB, seq2seq_inputs, tiny_inputs, tiny_model, tiny_seq2seq


def causal_lm(family: str, seed: int = 0, **overrides) -> torch.nn.Module:
    config = tiny_model(family).config
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    return tf.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


def calibration(seed: int = 3, batches: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, VOCAB, (4, 48), generator=g) for _ in range(batches)]


def logits(model, family="llama"):
    inputs, real = tiny_inputs(family)
    with torch.no_grad():
        return model(**inputs).logits[real]


def state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


# --- the rotary-compatible mix ----------------------------------------------------------------------------------

def _rope(x, positions, dim=16):
    config = tf.LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=dim)
    cos, sin = LlamaRotaryEmbedding(config)(x, positions)
    return apply_rotary_pos_emb(x, x, cos, sin)[0]


def test_pair_scale_commutes_with_rope_and_a_general_mix_does_not():
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(2, 1, 5, 16, generator=g)  # [B, heads, T, d]
    positions = torch.arange(5)[None].expand(2, 5) * 7
    c = torch.complex(torch.randn(8, generator=g), torch.randn(8, generator=g))
    before, after = _rope(pair_scale(keys, c), positions), pair_scale(_rope(keys, positions), c)
    torch.testing.assert_close(before, after, rtol=1e-5, atol=1e-5)
    mix = torch.randn(16, 16, generator=g)  # a generic linear map of the key mixes frequency pairs
    assert (_rope(keys @ mix.T, positions) - _rope(keys, positions) @ mix.T).abs().max() > 1e-1


def test_query_compensation_equals_scaling_the_key():
    """q'·R k' with q' = c̄ ⊙ q equals q·R (c ⊙ k'), at any relative position."""
    g = torch.Generator().manual_seed(1)
    wq, x = torch.randn(16, 12, generator=g, dtype=torch.float64), torch.randn(12, generator=g, dtype=torch.float64)
    k_shared = torch.randn(1, 1, 3, 16, generator=g, dtype=torch.float64)
    c = torch.complex(torch.randn(8, generator=g, dtype=torch.float64), torch.randn(8, generator=g, dtype=torch.float64))
    q = (wq @ x).expand(1, 1, 3, 16)
    q_new = (conjugate_rows(wq, c) @ x).expand(1, 1, 3, 16)
    positions = torch.tensor([[0, 4, 9]])
    ref = _rope(q.float(), positions) @ _rope(pair_scale(k_shared, c).float(), positions).mT
    got = _rope(q_new.float(), positions) @ _rope(k_shared.float(), positions).mT
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    rows = torch.randn(2, 16, 5, dtype=torch.float64)
    torch.testing.assert_close(to_real(to_complex(rows)), rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_pair_scale_dtypes(dtype):
    g = torch.Generator().manual_seed(2)
    x, c = torch.randn(3, 16, generator=g), torch.complex(torch.randn(8, generator=g), torch.randn(8, generator=g))
    ref = to_real(to_complex(x.double().T[None]) * c.to(torch.complex128)[:, None])[0].T  # complex multiply
    out = pair_scale(x.to(dtype), c)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=3e-2 if dtype != torch.float32 else 1e-5)


# --- grouped-query conversion ------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2"])
@pytest.mark.parametrize("init", ["mean", "svd", "calibrated"])
def test_unchanged_kv_heads_is_exact(family, init):
    model = causal_lm(family)
    ref, kv = logits(model, family), model.config.num_key_value_heads
    convert_gqa(model, kv_heads=kv, init=init, calibration=calibration() if init == "calibrated" else None,
                progress=False)
    torch.testing.assert_close(logits(model, family), ref, rtol=0, atol=1e-5)


def test_moments_computed_once_give_the_same_conversion():
    from headwise.conversion import input_moments
    from headwise.conversion.checks import convertible_sites

    a, b = causal_lm("llama"), causal_lm("llama")
    moments = input_moments(b, convertible_sites(b, "test"), calibration(), progress=False)
    convert_gqa(a, kv_heads=1, init="calibrated", calibration=calibration(), progress=False)
    convert_gqa(b, kv_heads=1, init="calibrated", moments=moments, progress=False)
    torch.testing.assert_close(logits(b), logits(a), rtol=0, atol=1e-6)
    with pytest.raises(HeadwiseError, match="ignores the calibration set"):
        convert_gqa(causal_lm("llama"), kv_heads=1, init="svd", moments=moments)


def test_mean_merge_equals_hand_average():
    model = causal_lm("llama")  # 4 query heads, 2 key/value heads of width 8
    k = model.model.layers[0].self_attn.k_proj.weight.detach().clone().unflatten(0, (2, 8))
    convert_gqa(model, kv_heads=1, init="mean", progress=False)
    torch.testing.assert_close(model.model.layers[0].self_attn.k_proj.weight, k.mean(0))
    assert model.config.num_key_value_heads == 1 and model.model.layers[0].self_attn.num_key_value_groups == 4


def test_fitted_merges_beat_mean_pooling():
    errors = {}
    for init in ("mean", "svd", "calibrated"):
        model = causal_lm("llama")
        ref = logits(model)
        convert_gqa(model, kv_heads=1, init=init, calibration=calibration() if init == "calibrated" else None,
                    progress=False)
        errors[init] = float((logits(model) - ref).square().mean())
    assert errors["calibrated"] < errors["svd"] < 0.7 * errors["mean"], errors


def test_a_conversion_never_holds_every_sites_new_query_and_output_at_once():
    """A fit keeps ``[d, d]`` maps; each site's new q and o are built as it is changed, and its old ones go. Had
    every site's new q and o been built before any site changed, the old and new would coexist: at least the q and
    o bytes of all sites above the loaded model (counted allocation by allocation, the model built inside the count
    so its freed tensors count too; the first call warms transformers' lazy tables)."""
    from peak_bytes import peak_tensor_bytes

    config = tf.LlamaConfig(hidden_size=64, num_hidden_layers=16, num_attention_heads=8, num_key_value_heads=4,
                            intermediate_size=16, vocab_size=VOCAB, max_position_embeddings=64)

    def build():
        torch.manual_seed(0)
        return tf.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()

    layers = build().model.layers
    qo = sum(a.self_attn.q_proj.weight.nbytes + a.self_attn.o_proj.weight.nbytes for a in layers)
    for _ in range(2):
        loaded = peak_tensor_bytes(build)
        converted = peak_tensor_bytes(lambda: convert_gqa(build(), kv_heads=2, init="svd", progress=False))
    assert converted - loaded < qo, (converted - loaded) / qo


def _permute_heads(model, perm):
    """Permute the heads of an MHA Llama's layers (q, k, v rows and o columns together): same function."""
    for layer in model.model.layers:
        attn, d = layer.self_attn, layer.self_attn.head_dim
        rows = (torch.as_tensor(perm)[:, None] * d + torch.arange(d)).flatten()
        with torch.no_grad():
            for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
                proj.weight.copy_(proj.weight[rows])
            attn.o_proj.weight.copy_(attn.o_proj.weight[:, rows])


def test_similarity_grouping_is_permutation_invariant():
    base = causal_lm("llama", num_key_value_heads=4)
    permuted = copy.deepcopy(base)
    _permute_heads(permuted, [2, 0, 3, 1])
    torch.testing.assert_close(logits(permuted), logits(base), rtol=0, atol=1e-5)
    for model in (base, permuted):
        convert_gqa(model, kv_heads=2, grouping="similarity", init="svd", progress=False)
    torch.testing.assert_close(logits(permuted), logits(base), rtol=0, atol=1e-4)


def test_similarity_grouping_finds_heads_that_share_keys():
    """Heads 0 and 2 (and 1 and 3) read identical keys/values: similarity grouping merges them exactly, by
    permuting query heads and output columns; contiguous grouping cannot."""
    model = causal_lm("llama", num_key_value_heads=4)
    for layer in model.model.layers:
        attn, d = layer.self_attn, layer.self_attn.head_dim
        with torch.no_grad():
            for proj in (attn.k_proj, attn.v_proj):
                proj.weight[2 * d: 3 * d] = proj.weight[:d]
                proj.weight[3 * d:] = proj.weight[d: 2 * d]
    ref, contiguous = logits(model), copy.deepcopy(model)
    convert_gqa(model, kv_heads=2, grouping="similarity", init="svd", progress=False)
    convert_gqa(contiguous, kv_heads=2, grouping="contiguous", init="svd", progress=False)
    torch.testing.assert_close(logits(model), ref, rtol=0, atol=1e-5)
    assert (logits(contiguous) - ref).abs().max() > 1e-2


def test_native_export_loads_with_plain_transformers(tmp_path):
    model = causal_lm("qwen2", num_key_value_heads=2)  # biases on q/k/v
    convert_gqa(model, kv_heads=1, init="calibrated", calibration=calibration(), progress=False)
    headwise.io.export_plain(model, tmp_path / "plain")
    plain = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "plain").eval()
    assert plain.config.num_key_value_heads == 1
    torch.testing.assert_close(logits(plain, "qwen2"), logits(model, "qwen2"), rtol=0, atol=1e-5)
    prompt = tiny_inputs("qwen2")[0]["input_ids"][:1]
    out = plain.generate(prompt, max_new_tokens=5, do_sample=False)
    assert torch.equal(out, model.generate(prompt, max_new_tokens=5, do_sample=False))
    with pytest.raises(HeadwiseError, match="not empty"):
        headwise.io.export_plain(model, tmp_path / "plain")


def test_marian_decoder_self_attention(tmp_path):
    model = tiny_seq2seq("marian", attn="sdpa")
    inputs, _, tgt = seq2seq_inputs("marian")
    with torch.no_grad():
        ref = model(**inputs).logits[tgt]
    same = copy.deepcopy(model)
    convert_gqa(same, kv_heads=4, init="svd", progress=False)
    with torch.no_grad():
        torch.testing.assert_close(same(**inputs).logits[tgt], ref, rtol=0, atol=1e-5)
    cal = [seq2seq_inputs("marian", seed=s)[0] for s in range(12)]
    convert_gqa(model, kv_heads=2, init="calibrated", calibration=cal, progress=False)
    sites = [s for s in headwise.find_sites(model) if s.kind == "dec-self"]
    assert {(s.num_heads, s.num_kv_heads) for s in sites} == {(4, 2)}
    assert all(s.num_kv_heads == 4 for s in headwise.find_sites(model) if s.kind != "dec-self")
    src = inputs["input_ids"][:1]
    cached = model.generate(src, max_new_tokens=6, do_sample=False, num_beams=1)
    uncached = model.generate(src, max_new_tokens=6, do_sample=False, num_beams=1, use_cache=False)
    assert torch.equal(cached, uncached)
    headwise.save_pretrained(model, tmp_path / "m")
    back = headwise.from_pretrained(tmp_path / "m")
    with torch.no_grad():
        torch.testing.assert_close(back(**inputs).logits, model(**inputs).logits, rtol=0, atol=1e-5)
    with pytest.raises(HeadwiseError, match="no key/value head count"):
        headwise.io.export_plain(model, tmp_path / "plain")


# --- latent keys/values ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("rope_pairs", [0, 2])
def test_full_latent_rank_is_exact(family, rope_pairs):
    model = causal_lm(family)
    ref = logits(model, family)
    convert_latent(model, kv_budget=1.0, rope_pairs=rope_pairs, init="calibrated", calibration=calibration(),
                   progress=False)
    assert isinstance(model.model.layers[0].self_attn.k_proj, LatentProjection)
    torch.testing.assert_close(logits(model, family), ref, rtol=0, atol=1e-4)


def test_latent_budget_saves_and_reloads(tmp_path):
    model = causal_lm("llama")  # 2 kv heads × 8 × (k, v) = 32 values per layer, 2 layers
    ref = logits(model)
    assert kv_values_per_token(model) == 64
    convert_latent(model, kv_budget=0.5, rope_pairs=1, init="svd", progress=False)
    assert kv_values_per_token(model) == 32  # rank 12 + 4 rotary rows, per layer
    assert model.model.layers[0].self_attn.k_proj.rank == 12
    err = (logits(model) - ref).abs().max()
    assert 1e-4 < err < (ref.abs().max())  # lossy, not destroyed
    headwise.save_pretrained(model, tmp_path / "m")
    back = headwise.from_pretrained(tmp_path / "m")
    torch.testing.assert_close(logits(back), logits(model), rtol=0, atol=1e-6)
    with pytest.raises(HeadwiseError, match="latent"):
        headwise.io.export_plain(model, tmp_path / "plain")


def test_latent_marian_full_rank_exact():
    model = tiny_seq2seq("marian", attn="sdpa")
    inputs, _, tgt = seq2seq_inputs("marian")
    with torch.no_grad():
        ref = model(**inputs).logits[tgt]
        convert_latent(model, kv_budget=1.0, init="svd", progress=False)
        torch.testing.assert_close(model(**inputs).logits[tgt], ref, rtol=0, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_conversions_in_half_precision(dtype):
    """The fit runs in float64 whatever the model dtype: a half model converts to the fp32 result, rounded."""
    for convert in (lambda m: convert_gqa(m, kv_heads=1, init="svd", progress=False),
                    lambda m: convert_latent(m, kv_budget=0.5, rope_pairs=1, init="svd", progress=False)):
        ref, half = causal_lm("llama"), causal_lm("llama").to(dtype)
        convert(ref), convert(half)
        tol = dict(rtol=0, atol=0.05 if dtype == torch.float16 else 0.3)
        for name, p in half.state_dict().items():
            torch.testing.assert_close(p.float(), ref.state_dict()[name].to(dtype).float(), rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(logits(half).float(), logits(ref), **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_latent_projection_dtypes(dtype):
    torch.manual_seed(0)
    down, up, rope = torch.nn.Linear(8, 3), torch.nn.Linear(3, 4, bias=False), torch.nn.Linear(8, 2)
    proj = LatentProjection(down, up, rope, torch.tensor([2, 0, 3, 1, 4, 5]))
    x = torch.randn(2, 5, 8)
    dense = x @ proj.weight.T + proj.bias  # the equivalent dense projection, float32
    cat = torch.cat([rope(x), up(down(x))], -1)
    torch.testing.assert_close(dense[..., [2, 0, 3, 1, 4, 5]], dense[..., proj.order])
    torch.testing.assert_close(dense, cat[..., proj.order])
    out = proj.to(dtype)(x.to(dtype))
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), dense.detach(), rtol=0, atol=1e-5 if dtype == torch.float32 else 5e-2)


def test_converted_models_run_on_meta():
    for convert in (lambda m: convert_gqa(m, kv_heads=1, init="svd", progress=False),
                    lambda m: convert_latent(m, kv_budget=0.5, rope_pairs=1, init="svd", progress=False)):
        model = causal_lm("llama")
        convert(model)
        model.to("meta")
        ids = torch.randint(2, VOCAB, (2, 6)).to("meta")
        with torch.no_grad():
            out = model(input_ids=ids).logits
        assert out.device.type == "meta" and out.shape == (2, 6, VOCAB)


# --- bad inputs leave the model untouched ------------------------------------------------------------------------

@pytest.mark.parametrize("case,match", [
    (lambda m: convert_gqa(m, kv_heads=3, init="svd"), "does not divide the 4 query heads"),
    (lambda m: convert_gqa(m, kv_heads=0, init="svd"), "kv_heads 0 must be a positive integer"),
    (lambda m: convert_gqa(m, kv_heads=1, init="calibrated"), "needs calibration"),
    (lambda m: convert_gqa(m, kv_heads=1, init="pca"), "choose 'mean'"),
    (lambda m: convert_gqa(m, kv_heads=1, grouping="random", init="svd"), "choose 'contiguous'"),
    (lambda m: convert_latent(m, rank=33, init="svd"), "latent rank 33 is outside 1..32"),
    (lambda m: convert_latent(m, kv_budget=1.5, init="svd"), "must be in"),
    (lambda m: convert_latent(m, kv_budget=0.5, rank=4, init="svd"), "exactly one"),
    (lambda m: convert_latent(m, rank=4, rope_pairs=9, init="svd"), "rope_pairs=9"),
    (lambda m: convert_gqa(m, kv_heads=1, init="calibrated", calibration=[torch.randint(2, 9, (1, 4))]), "calibration set holds 4 tokens"),
])
def test_bad_input_leaves_model_untouched(case, match):
    model = causal_lm("llama")
    before, config = state(model), model.config.to_dict()
    with pytest.raises(HeadwiseError, match=match):
        case(model)
    assert model.config.to_dict() == config
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_marian_eager_is_refused():
    model = tiny_seq2seq("marian", attn="eager")
    with pytest.raises(HeadwiseError, match="attn_implementation='sdpa'"):
        convert_gqa(model, kv_heads=2, init="svd")


def test_models_without_a_decoder_cache_are_refused():
    encoder = tiny_model("bert")
    before = state(encoder)
    with pytest.raises(HeadwiseError, match="an encoder keeps no KV cache"):
        convert_gqa(encoder, kv_heads=2, init="svd")
    assert all(torch.equal(before[k], v) for k, v in encoder.state_dict().items())
    with pytest.raises(HeadwiseError, match=r"supports .*llama.* \(separate q/k/v"):
        convert_latent(tiny_model("gpt2"), kv_budget=0.5, init="svd")  # fused c_attn: no separate K/V projections
    latent = causal_lm("llama")
    convert_latent(latent, kv_budget=0.5, init="svd", progress=False)
    before = state(latent)
    with pytest.raises(HeadwiseError, match="already converted"):
        convert_gqa(latent, kv_heads=1, init="svd")
    assert all(torch.equal(before[k], v) for k, v in latent.state_dict().items())
