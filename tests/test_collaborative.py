"""Collaborative heads: the decomposition, the layer, conversion of every supported family, save/reload, errors."""

import copy
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from tiny import tiny_inputs, tiny_model

import headwise
from headwise import HeadwiseError
from headwise.collaborative import (CollaborativeAttention, compress, decompose, input_moments, is_collaborative,
                                    tradeoff)
from headwise.collaborative.decompose import block_factors, exact_factors, hosvd_factors, relative_error
from headwise.compat import CACHE

FAMILIES = ["bert", "distilbert", "albert", "gpt2", "vit"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Many tiny float64 ops: with a busy machine, OpenMP spinning makes 2 threads ~100× slower than 1."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _random_biases(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    return model


def _dense(f):
    return torch.einsum("ir,hr,jr->hij", f.query, f.mixing, f.key)


def _targets(seed=0, H=4, d=8, D=32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(H, d, D, generator=g, dtype=torch.float64),
            torch.randn(H, d, D, generator=g, dtype=torch.float64))


def test_exact_and_block_factors_against_dense():
    P, K = _targets()
    T = torch.einsum("hdi,hdj->hij", P, K)
    assert torch.allclose(_dense(exact_factors(P, K)), T, atol=1e-10)
    for rank in (5, 17, 31):
        f = block_factors(P, K, rank)
        dense_err = ((T - _dense(f)).norm() / T.norm()).item()
        assert relative_error(P, K, f) == pytest.approx(dense_err, abs=1e-9)
        # optimal among block forms: the discarded singular values of the per-head SVDs
        s = torch.linalg.svdvals(T).flatten().sort(descending=True).values
        assert dense_err == pytest.approx((s[rank:].square().sum() / s.square().sum()).sqrt().item(), abs=1e-9)
    f = hosvd_factors(P, K, 12)
    assert relative_error(P, K, f) == pytest.approx(((T - _dense(f)).norm() / T.norm()).item(), abs=1e-9)


def test_als_improves_on_its_start_and_matches_tensorly():
    P, K = _targets(1)
    start = relative_error(P, K, block_factors(P, K, 12))
    ours = decompose(P, K, 12, init="block", iterations=8, tol=0)
    assert ours.error < start
    assert decompose(P, K, 32, iterations=5).error == 0.0  # rank H·d: exact, no iterations
    ref = decompose(P, K, 12, init="block", iterations=8, solver="tensorly")  # same start, tensorly's dense ALS
    assert ref.error < start and ours.error == pytest.approx(ref.error, abs=2e-3)  # update order differs


def test_data_aware_objective_is_the_score_error():
    P, K = _targets(2)
    g = torch.Generator().manual_seed(3)
    X = torch.randn(6, 20, 32, generator=g, dtype=torch.float64) @ torch.randn(32, 32, generator=g, dtype=torch.float64)
    Cq = X.flatten(0, 1).T @ X.flatten(0, 1) / 120
    Xc = X - X.mean(1, keepdim=True)
    Ck = Xc.flatten(0, 1).T @ Xc.flatten(0, 1) / 120
    aware = decompose(P, K, 10, iterations=30, covariance=(Cq, Ck), ridge=1e-9)
    plain = decompose(P, K, 10, iterations=30)

    def score_error(f):  # every (query token, key token) pair, keys centred per sequence (what softmax sees)
        E = torch.einsum("hdi,hdj->hij", P, K) - _dense(f)
        S = torch.einsum("ni,hij,mj->hnm", X.flatten(0, 1), E, Xc.flatten(0, 1))
        S0 = torch.einsum("ni,hdi,hdj,mj->hnm", X.flatten(0, 1), P, K, Xc.flatten(0, 1))
        return (S.norm() / S0.norm()).item()

    assert aware.error == pytest.approx(score_error(aware.factors), rel=1e-4)
    assert score_error(aware.factors) < score_error(plain.factors)


@pytest.mark.parametrize("family", FAMILIES)
def test_exact_form_matches_the_original_eager_model(family):
    original = _random_biases(tiny_model(family, attn="eager"))
    model = copy.deepcopy(original)
    model.set_attn_implementation("headwise")
    exact = headwise.find_sites(model)[0].num_heads * headwise.find_sites(model)[0].head_dim
    result = compress(model, dk=exact)
    assert result.dk == exact and all(is_collaborative(s.module) for s in headwise.find_sites(model))
    inputs, real = tiny_inputs(family)
    with torch.no_grad():
        a, b = original(**inputs, output_attentions=True), model(**inputs, output_attentions=True)
    assert (a.last_hidden_state - b.last_hidden_state)[real].abs().max() < 1e-5
    for pa, pb in zip(a.attentions, b.attentions):
        assert ((pa - pb) * real[:, None, :, None]).abs().max() < 1e-5  # padded query rows are arbitrary


def _capture(module):
    captured = {}

    def hook(m, args, kwargs):
        captured["x"] = args[0] if args else kwargs["hidden_states"]

    module.register_forward_pre_hook(hook, with_kwargs=True)
    return captured


def test_low_rank_scores_against_a_dense_reference():
    """Probabilities of a compressed BERT layer = softmax(s·(X Â_h Xᵀ + X c_h) + mask), computed by hand."""
    model = _random_biases(tiny_model("bert"))
    site = headwise.find_sites(model)[0]
    content = torch.einsum("hdj,hd->hj", site.k.weight, site.q.bias)
    compress(model, dk=6)
    module = site.module
    A = torch.einsum("ri,hr,rj->hij", module.query.weight, module.mixing, module.key.weight)
    inputs, real = tiny_inputs("bert")
    captured = _capture(module)
    with torch.no_grad():
        probs = model(**inputs, output_attentions=True).attentions[0]
        x = captured["x"]
        scores = (torch.einsum("bti,hij,bsj->bhts", x, A, x) + torch.einsum("hj,bsj->bhs", content, x)[:, :, None])
        scores = scores * module.scaling + torch.where(real, 0.0, -1e9)[:, None, None, :]
    assert torch.allclose(probs, F.softmax(scores, -1), atol=1e-5)


def test_gpt2_cache_and_generation():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    lm = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=97, bos_token_id=0,
                                    eos_token_id=0)).eval()
    lm.set_attn_implementation("headwise")
    original = copy.deepcopy(lm)
    compress(lm, dk=32)
    ids = torch.randint(2, 97, (2, 5))
    mask = torch.ones_like(ids)
    kw = dict(max_new_tokens=5, do_sample=False, pad_token_id=0, attention_mask=mask)
    assert torch.equal(original.generate(ids, **kw), lm.generate(ids, **kw))
    small = copy.deepcopy(original)
    compress(small, dk=10)
    seq = small.generate(ids, **kw)
    with torch.no_grad():
        full = small(seq, use_cache=False).logits[:, -1]
        past = small(seq[:, :-1], use_cache=True)[CACHE]
        step = small(seq[:, -1:], **{CACHE: past}).logits[:, -1]
    assert (full - step).abs().max() < 1e-5


def test_save_and_reload_in_a_fresh_process(tmp_path):
    model = _random_biases(tiny_model("albert"))
    result = compress(model, dk=9)
    assert len(result.sites) == 1  # ALBERT's shared module is decomposed once
    inputs, _ = tiny_inputs("albert")
    headwise.save_pretrained(model, tmp_path / "m")
    torch.save(inputs, tmp_path / "inputs.pt")
    code = (f"import torch, headwise, headwise.collaborative\n"
            f"m = headwise.from_pretrained({str(tmp_path / 'm')!r})\n"
            f"torch.save(m(**torch.load({str(tmp_path / 'inputs.pt')!r})).last_hidden_state, "
            f"{str(tmp_path / 'out.pt')!r})\n")
    subprocess.run([sys.executable, "-c", code], check=True)
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
    assert torch.equal(torch.load(tmp_path / "out.pt"), expected)


def test_standalone_layer_is_multi_head_attention_at_init_and_trains():
    torch.manual_seed(0)
    layer = CollaborativeAttention(hidden_size=16, num_heads=4, dk=16, causal=True).eval()
    x = torch.randn(2, 5, 16)
    real = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    out, probs = layer(x, real, output_attentions=True)
    q = layer.query(x).unflatten(-1, (4, 4)).transpose(1, 2)  # dims c ↦ head c mod 4: a permutation of heads
    q = layer.query(x).unflatten(-1, (4, 4)).permute(0, 3, 1, 2)
    k = layer.key(x).unflatten(-1, (4, 4)).permute(0, 3, 1, 2)
    keep = real.bool()[:, None, None, :] & torch.ones(5, 5, dtype=torch.bool).tril()
    ref = F.softmax((q @ k.transpose(-1, -2) * 0.5).masked_fill(~keep, float("-inf")), -1)
    assert torch.allclose(probs, ref, atol=1e-6)
    v = layer.value(x).unflatten(-1, (4, 4)).transpose(1, 2)
    assert torch.allclose(out, layer.output((ref @ v).transpose(1, 2).flatten(2)), atol=1e-6)
    layer.train()
    layer(x, real)[0].sum().backward()
    assert layer.mixing.grad.abs().sum() > 0 and layer.query.weight.grad.abs().sum() > 0


def test_calibration_moments_skip_padding():
    model = tiny_model("bert")
    site = headwise.find_sites(model)[0]
    inputs, real = tiny_inputs("bert")
    moments = input_moments(model, [site], [inputs] * 20)  # 20 × 18 real tokens ≥ hidden size 32
    captured = _capture(site.module)
    with torch.no_grad():
        model(**inputs)
    x = captured["x"].double()
    xs = [x[b, real[b]] for b in range(len(x))]
    n = sum(len(t) for t in xs)
    cq = sum(t.T @ t for t in xs) / n
    ck = sum((t - t.mean(0)).T @ (t - t.mean(0)) for t in xs) / n
    assert torch.allclose(moments[site.path][0], cq, atol=1e-8)
    assert torch.allclose(moments[site.path][1], ck, atol=1e-8)


def test_data_aware_compression_and_tradeoff():
    model = tiny_model("distilbert")
    inputs, _ = tiny_inputs("distilbert")
    curve = tradeoff(model, [4, 16, 32], calibration=[inputs] * 20)
    assert [c.dk for c in curve] == [4, 16, 32] and curve[-1].sites[0].score_error == 0.0
    assert curve[0].sites[0].score_error > curve[1].sites[0].score_error
    assert not any(is_collaborative(s.module) for s in headwise.find_sites(model))  # tradeoff changes nothing
    result = compress(model, dk=16, calibration=[inputs] * 20)
    assert result.objective == "scores" and result.params_after < result.params_before


def _fingerprint(model):
    return {k: v.clone() for k, v in model.state_dict().items()}, [type(m) for m in model.modules()]


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, None])
def test_bad_dk_leaves_the_model_untouched(bad):
    model = tiny_model("bert")
    state, types = _fingerprint(model)
    with pytest.raises(HeadwiseError, match="dk must be a positive integer" if bad is not None else
                       "^give dk= or a CollaborativeConfig$"):
        compress(model, dk=bad)
    assert [type(m) for m in model.modules()] == types
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())


def test_refusals_and_oversized_dk():
    qwen2 = tiny_model("qwen2")  # rotary with query/key biases (rotary Llama / Mistral: test_collaborative_rotary)
    with pytest.raises(HeadwiseError, match="biases"):
        compress(qwen2, dk=8)
    model = tiny_model("bert")
    state, types = _fingerprint(model)
    with pytest.raises(HeadwiseError, match="calibration set is empty"):
        compress(model, dk=8, calibration=[])
    inputs, _ = tiny_inputs("bert")
    with pytest.raises(HeadwiseError, match="too short"):
        compress(model, dk=8, calibration=[inputs])
    with pytest.raises(HeadwiseError, match="tokenizer"):
        compress(model, dk=8, calibration=["a text"])
    assert [type(m) for m in model.modules()] == types and not model.config.to_dict().get("headwise")
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    with pytest.warns(UserWarning, match="exact form"):
        assert compress(model, dk=1000).dk == 32
    with pytest.raises(HeadwiseError, match="already collaborative"):
        compress(model, dk=8)


def test_surgery_refuses_collaborative_sites():
    model = tiny_model("bert")
    compress(model, dk=8)
    with pytest.raises(headwise.HeadwiseError, match="prune before compressing"):
        headwise.prune_heads(model, {"enc-self.0": [1]})


def test_a_fractional_dk_gives_each_pruned_site_its_share_and_round_trips(tmp_path):
    """dk=0.5 after uneven pruning: each site keeps half of *its* heads × head_dim (16 of 32, 8 of 16), the
    probabilities equal a dense reference built from each site's own factors, and the model reloads."""
    model = _random_biases(tiny_model("bert"))
    headwise.prune_heads(model, {"enc-self.0": [0, 1]})
    result = compress(model, dk=0.5)
    assert result.dk == 0.5 and [s.dk for s in result.sites] == [8, 16]
    modules = [s.module for s in headwise.find_sites(model)]
    assert [tuple(m.mixing.shape) for m in modules] == [(2, 8), (4, 16)]
    inputs, real = tiny_inputs("bert")
    captured = _capture(modules[0])
    with torch.no_grad():
        probs = model(**inputs, output_attentions=True).attentions[0]
    module, x = modules[0], captured["x"]
    A = torch.einsum("ri,hr,rj->hij", module.query.weight, module.mixing, module.key.weight)
    scores = torch.einsum("bti,hij,bsj->bhts", x, A, x) + module.content_bias(x).transpose(1, 2)[:, :, None]
    scores = scores * module.scaling + torch.where(real, 0.0, -1e9)[:, None, None, :]
    assert torch.allclose(probs, F.softmax(scores, -1), atol=1e-5)
    headwise.save_pretrained(model, tmp_path / "m")
    again = headwise.from_pretrained(tmp_path / "m")
    with torch.no_grad():
        assert torch.equal(again(**inputs).last_hidden_state, model(**inputs).last_hidden_state)


@pytest.mark.parametrize("text, value", [("16", 16), ("16.0", 16), ("0.25", 0.25), ("0", None), ("1.5", None),
                                         ("1.0", 1), ("wide", None), ("-0.5", None)])
def test_cli_dk_takes_a_width_or_a_share(text, value):
    from headwise.cli.compress import _dk

    if value is None:
        with pytest.raises(HeadwiseError, match="positive integer width"):
            _dk(text)
    else:
        got = _dk(text)
        assert got == value and type(got) is type(value)
