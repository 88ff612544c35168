"""Collaborative heads under rotary positions with grouped K/V (Llama, Mistral): the complex per-frequency
decomposition against a dense reference, the converted model against eager attention, the KV cache and
generation, dtypes, the meta device, save/reload and refusals."""

import copy

import pytest
import torch
import transformers as tf
from tiny import tiny_inputs, tiny_model

import headwise
from headwise import HeadwiseError
from headwise.collaborative import CollaborativeConfig, compress, input_moments, is_collaborative
from headwise.collaborative.rotary import block_start, complex_planes, decompose_rotary
from headwise.compat import CACHE


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _targets(seed=0, H=4, G=2, d=8, D=16):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(H, d, D, generator=g, dtype=torch.float64),
            torch.randn(G, d, D, generator=g, dtype=torch.float64))


def _dense_error(P, K, f):
    """‖T − T̂‖ / ‖T‖ with every complex ``[D, D]`` form built densely, frequency by frequency."""
    a = complex_planes(P, torch.float64).conj()
    b = complex_planes(K.repeat_interleave(P.shape[0] // K.shape[0], 0), torch.float64)
    T = torch.einsum("chi,chj->chij", a, b)
    That = torch.zeros_like(T)
    for r, c in enumerate(f.frequencies.tolist()):
        That[c] += torch.einsum("h,i,j->hij", f.mixing[:, r], f.query[:, r], f.key[:, r])
    return ((T - That).norm() / T.norm()).item()


def _rope_scores(x, P, K, positions, base=10000.0):
    """Original scores ``[H, T, T]`` by hand: complex planes ``q_c e^{iθ_c i}``, ``k_c e^{iθ_c j}``."""
    H, d, _ = P.shape
    x = x.to(torch.complex128)
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    phase = torch.polar(torch.ones(len(positions), d // 2, dtype=torch.float64), positions[:, None] * theta)
    q = torch.einsum("chD,tD->htc", complex_planes(P, torch.float64), x) * phase
    k = torch.einsum("chD,tD->htc", complex_planes(K.repeat_interleave(H // K.shape[0], 0), torch.float64), x) * phase
    return torch.einsum("hic,hjc->hij", q.conj(), k).real


def test_exact_rank_block_start_and_als_against_dense():
    P, K = _targets()
    exact = decompose_rotary(P, K, 32)
    assert exact.device_error == 0 and _dense_error(P, K, exact.factors) < 1e-12
    for rank in (6, 12, 20):
        start = decompose_rotary(P, K, rank, iterations=0)
        # the block start keeps the largest rank-1 terms |a_{h,c}|·|b_{h,c}|: its error is the discarded ones
        a = complex_planes(P, torch.float64).conj()
        b = complex_planes(K.repeat_interleave(2, 0), torch.float64)
        s = (a.norm(dim=-1) * b.norm(dim=-1)).flatten().sort(descending=True).values
        discarded = (s[rank // 2:].square().sum() / s.square().sum()).sqrt().item()
        assert float(start.device_error) == pytest.approx(discarded)
        refined = decompose_rotary(P, K, rank, iterations=15, tol=0)
        assert float(refined.device_weight_error) == pytest.approx(_dense_error(P, K, refined.factors), abs=1e-10)
        assert float(refined.device_error) < float(start.device_error)
        assert refined.factors.frequencies.numel() == rank // 2


def test_factors_score_like_rotary_attention_at_every_offset():
    """The real module weights (planes, frequencies, complex mixing) reproduce the hand-built rotary scores of
    the complex forms they were fitted to: exactly at rank H·d, and with the decomposition's error below."""
    P, K = _targets(1)
    x = torch.randn(9, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    positions = torch.arange(9, dtype=torch.float64) * 3.0
    layer = headwise.collaborative.layer.RotaryCollaborativeAttention.__new__(
        headwise.collaborative.layer.RotaryCollaborativeAttention)
    torch.nn.Module.__init__(layer)
    theta = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    angles = torch.cat([positions[:, None] * theta] * 2, -1)[None]
    S = _rope_scores(x, P, K, positions)
    for rank, tol in ((32, 1e-10), (12, None)):
        dec = decompose_rotary(P, K, rank, iterations=10)
        query, key, mixing = dec.factors.real_weights(torch.float64)
        layer.head_dim, layer.mixing, layer.frequencies = 8, torch.nn.Parameter(mixing), dec.factors.frequencies
        q, k = layer.rotary_qk((x @ query.T)[None], (x @ key.T)[None], angles.cos(), angles.sin())
        got = (q @ k.transpose(-1, -2))[0]
        if tol is not None:
            assert (got - S).abs().max() < tol
        else:  # the low-rank scores equal the scores of the fitted forms, built densely
            f = dec.factors
            offsets = positions[None, :] - positions[:, None]  # j − i
            ref = torch.zeros_like(S)
            for r, c in enumerate(f.frequencies.tolist()):
                u, v = x.to(f.query.dtype) @ f.query[:, r], x.to(f.key.dtype) @ f.key[:, r]  # α·x, β·x
                turn = torch.polar(torch.ones_like(offsets), theta[c] * offsets)  # e^{iθ_c (j − i)}
                ref += torch.einsum("h,i,j,ij->hij", f.mixing[:, r], u, v, turn).real
            assert torch.allclose(got, ref, atol=1e-9)


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_exact_form_matches_the_original_eager_model(family):
    original = tiny_model(family, attn="eager")
    model = copy.deepcopy(original)
    model.set_attn_implementation("headwise")
    result = compress(model, dk=32)
    assert result.dk == 32 and all(is_collaborative(s.module) for s in headwise.find_sites(model))
    assert result.params_before == 2 * (4 + 2) * 8 * 32 and result.sites[0].params_after == 2 * 32 * 32 + 4 * 32
    inputs, real = tiny_inputs(family)  # right- and left-padded rows
    with torch.no_grad():
        a, b = original(**inputs, output_attentions=True), model(**inputs, output_attentions=True)
    assert (a.last_hidden_state - b.last_hidden_state)[real].abs().max() < 1e-5
    for pa, pb in zip(a.attentions, b.attentions):
        assert ((pa - pb) * real[:, None, :, None]).abs().max() < 1e-5


def _lm(seed=0):
    torch.manual_seed(seed)
    config = tf.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=37, vocab_size=97, bos_token_id=0, eos_token_id=0)
    lm = tf.LlamaForCausalLM(config).eval()
    lm.set_attn_implementation("headwise")
    return lm


def test_generation_and_kv_cache():
    lm = _lm()
    original = copy.deepcopy(lm)
    compress(lm, dk=32)
    ids = torch.randint(2, 97, (2, 5), generator=torch.Generator().manual_seed(3))
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(ids))
    assert torch.equal(original.generate(ids, **kw), lm.generate(ids, **kw))
    small = copy.deepcopy(original)
    compress(small, dk=10)
    seq = small.generate(ids, **kw)
    with torch.no_grad():
        full = small(seq, use_cache=False).logits[:, -1]
        past = small(seq[:, :-1], use_cache=True)[CACHE]
        assert past.layers[0].keys.shape[1:] == (1, seq.shape[1] - 1, 10)  # one shared key of width dk cached
        step = small(seq[:, -1:], **{CACHE: past}).logits[:, -1]
    assert (full - step).abs().max() < 1e-5


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-2), (torch.bfloat16, 6e-2)])
def test_low_rank_model_in_half_precision_against_float32(dtype, tol):
    lm = _lm()
    compress(lm, dk=12)
    ids = torch.randint(2, 97, (2, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = lm(ids).logits
        half = copy.deepcopy(lm).to(dtype)(ids).logits.float()
    assert (half - ref).abs().max() < tol * ref.abs().max()


def test_data_aware_objective_uses_uncentred_keys_and_lowers_the_score_error():
    model = tiny_model("llama")
    site = headwise.find_sites(model)[0]
    inputs, real = tiny_inputs("llama")
    moments = input_moments(model, headwise.find_sites(model), [inputs] * 20)
    captured = {}
    site.module.register_forward_pre_hook(lambda m, a, k: captured.update(x=k["hidden_states"]), with_kwargs=True)
    with torch.no_grad():
        model(**inputs)
    xs = [captured["x"].double()[b, real[b]] for b in range(3)]
    n = sum(len(t) for t in xs)
    expected = sum(t.T @ t for t in xs) / n
    assert torch.allclose(moments[site.path][0], expected, atol=1e-8)
    assert torch.allclose(moments[site.path][1], expected, atol=1e-8)  # keys not centred under rotation
    P, K = site.q.weight.detach().double(), site.k.weight.detach().double()
    aware = decompose_rotary(P, K, 12, covariance=moments[site.path], ridge=1e-9, iterations=20)
    plain = decompose_rotary(P, K, 12, iterations=20)
    x = torch.cat(xs)
    positions = torch.arange(len(x), dtype=torch.float64)
    S = _rope_scores(x, P, K, positions)

    def score_error(f):
        q, k, m = f.real_weights(torch.float64)
        layer = type("L", (headwise.collaborative.layer.RotaryCollaborativeAttention,), {})
        mod = layer.__new__(layer)
        torch.nn.Module.__init__(mod)
        mod.head_dim, mod.mixing, mod.frequencies = 8, torch.nn.Parameter(m), f.frequencies
        theta = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
        ang = torch.cat([positions[:, None] * theta] * 2, -1)[None]
        qq, kk = mod.rotary_qk((x @ q.T)[None], (x @ k.T)[None], ang.cos(), ang.sin())
        return ((qq @ kk.transpose(-1, -2))[0] - S).norm() / S.norm()

    assert score_error(aware.factors) < score_error(plain.factors)
    result = compress(model, dk=12, moments=moments)
    assert result.objective == "scores" and 0 < result.sites[0].score_error < 1


def test_save_and_reload(tmp_path):
    lm = _lm()
    compress(lm, dk=10)
    headwise.save_pretrained(lm, tmp_path / "m")
    again = headwise.from_pretrained(tmp_path / "m")
    ids = torch.randint(2, 97, (2, 7), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(again(ids).logits, lm(ids).logits)
    module = again.model.layers[0].self_attn
    assert is_collaborative(module) and torch.equal(module.frequencies, lm.model.layers[0].self_attn.frequencies)


def test_calibrated_compress_on_the_meta_device():
    model = tiny_model("llama").to("meta")
    inputs, _ = tiny_inputs("llama")
    inputs = {"input_ids": inputs["input_ids"].to("meta")}
    config = CollaborativeConfig(dk=12, tol=0.0, iterations=2)
    result = compress(model, config=config, calibration=[inputs] * 20, progress=False)
    assert all(s.device_score_error.device.type == "meta" for s in result.sites)
    tensors = dict(model.named_parameters()) | dict(model.named_buffers())
    assert all(t.device.type == "meta" for t in tensors.values())
    assert model(**inputs)[0].device.type == "meta"


def _fingerprint(model):
    return {k: v.clone() for k, v in model.state_dict().items()}, [type(m) for m in model.modules()]


def test_refusals_leave_the_model_untouched():
    model = tiny_model("llama")
    state, types = _fingerprint(model)
    with pytest.raises(HeadwiseError, match="must be even"):
        compress(model, dk=7)
    with pytest.raises(HeadwiseError, match="complex ALS"):
        compress(model, config=CollaborativeConfig(dk=8, init="hosvd"))
    assert [type(m) for m in model.modules()] == types and not model.config.to_dict().get("headwise")
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    with pytest.raises(HeadwiseError, match="biases"):
        compress(tiny_model("qwen2"), dk=8)
    torch.manual_seed(0)
    biased = tf.LlamaModel(tf.LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                          num_key_value_heads=2, intermediate_size=37, vocab_size=97,
                                          attention_bias=True))
    with pytest.raises(HeadwiseError, match="biases"):
        compress(biased, dk=8)


def test_block_start_is_exact_where_a_frequency_keeps_every_head():
    P, K = _targets(3)
    a = complex_planes(P, torch.float64).conj()
    b = complex_planes(K.repeat_interleave(2, 0), torch.float64)
    active, mixing, query, key = block_start(a, b, 16)  # all 4 frequencies × 4 heads
    assert bool(active.all())
    dense = torch.einsum("chr,cir,cjr->chij", mixing, query, key)
    assert torch.allclose(dense, torch.einsum("chi,chj->chij", a, b), atol=1e-12)


def test_sites_of_a_converted_model_keep_their_head_counts():
    """The shared width is no multiple of the head dim: heads are counted by the mixing, K/V heads by the values."""
    model = tiny_model("llama")
    compress(model, dk=6)
    assert [(s.num_heads, s.num_kv_heads) for s in headwise.find_sites(model)] == [(4, 2), (4, 2)]


def test_after_removing_a_key_value_group_the_exact_form_is_unchanged():
    """A pruned layer has fewer KV groups than the config says: the converted forward reads them from v_proj."""
    from headwise.pruning import prune_heads

    lm = _lm()
    prune_heads(lm, {"dec-self.0": [2, 3], "dec-self.1": [0, 1]})  # one whole group of two query heads each
    original = copy.deepcopy(lm)
    compress(lm, dk=16)  # 2 heads x 8 dims left: the exact width
    ids = torch.randint(2, 97, (2, 6), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        a, b = original(input_ids=ids).logits, lm(input_ids=ids).logits
    assert (a - b).abs().max() < 1e-5
