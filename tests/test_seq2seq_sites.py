"""Encoder-decoder families (BART, Marian, T5): sites of three kinds, and every edit in each kind."""

import pytest
import torch
from tiny import SEQ2SEQ, seq2seq_inputs, tiny_model, tiny_seq2seq

import headwise
from headwise.compat import CACHE
from headwise.contract import Selection
from headwise.mechanisms import dropin
from headwise.mixing import HeadSwap, MixingConfig, add_mixers, swap_heads, undo_swaps
from headwise.pruning import L0Config, add_l0_gates, apply_masks, prune_masked
from headwise.runtime import add_gates
from headwise.sites import find_sites, select_sites

KINDS = ("enc-self", "dec-self", "dec-enc")
CLOSE = dict(atol=1e-4, rtol=1e-5)  # logits of these random models reach ±20
PLAN = {"enc-self.0": [1, 3], "enc-self.1": [0], "dec-self.0": [2], "dec-self.1": [0, 1], "dec-enc.0": [3],
        "dec-enc.1": [0, 2]}


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same_state(model, state):
    after = model.state_dict()
    return set(after) == set(state) and all(torch.equal(after[k], state[k]) for k in state)


def _generate(model, inputs, cache=True):
    """Six greedy tokens (EOS and padding suppressed, so every step is compared)."""
    with torch.no_grad():
        return model.generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                              max_new_tokens=6, min_new_tokens=6, suppress_tokens=[model.config.pad_token_id],
                              do_sample=False, num_beams=1, use_cache=cache)


@pytest.mark.parametrize("family", SEQ2SEQ)
def test_sites_have_three_kinds(family):
    sites = find_sites(tiny_seq2seq(family))
    assert [s.name for s in sites] == [f"{k}.{i}" for k in KINDS for i in range(2)]
    assert [s.causal for s in sites] == [False, False, True, True, False, False]
    assert all(s.num_heads == 4 and s.head_dim == (6 if family == "t5" else 8) for s in sites)
    if family == "t5":
        assert all(s.positions == "relative" and any("bias" in n for n in s.notes) for s in sites)


@pytest.mark.parametrize("family", SEQ2SEQ)
def test_headwise_equals_eager_with_padding_on_both_sides(family):
    inputs, src, tgt = seq2seq_inputs(family)
    ours, eager = tiny_seq2seq(family), tiny_seq2seq(family, attn="eager")
    with torch.no_grad():
        ref = eager(**inputs, output_attentions=True)
        fast = ours(**inputs)  # SDPA path
        probs = ours(**inputs, output_attentions=True)  # explicit softmax path
    for out in (fast, probs):
        torch.testing.assert_close(out.logits[tgt], ref.logits[tgt], **CLOSE)
        torch.testing.assert_close(out.encoder_last_hidden_state[src], ref.encoder_last_hidden_state[src],
                                   **CLOSE)
    for name, real in (("encoder_attentions", src), ("decoder_attentions", tgt), ("cross_attentions", tgt)):
        for got, want in zip(getattr(probs, name), getattr(ref, name), strict=True):
            keys = src if name != "decoder_attentions" else tgt
            assert got.shape == want.shape == (3, 4, real.shape[1], keys.shape[1])
            rows = real[:, None, :, None].expand_as(got)
            torch.testing.assert_close(got[rows], want[rows], atol=1e-6, rtol=0, msg=name)
            assert float(want[rows].max()) > 0.3  # the maps are not uniform: the comparison means something


@pytest.mark.parametrize("family", SEQ2SEQ)
def test_cached_generation_unchanged_by_noop_gates(family):
    inputs, _, _ = seq2seq_inputs(family)
    model = tiny_seq2seq(family)
    before = _generate(model, inputs)
    assert len({tuple(row) for row in before.tolist()}) == 3  # the source matters: the comparisons are sensitive
    assert torch.equal(_generate(tiny_seq2seq(family, attn="eager"), inputs), before)
    assert torch.equal(_generate(model, inputs, cache=False), before)
    add_gates(model)
    l0 = add_l0_gates(model, L0Config(init=10.0))  # eval gates exactly 1 (Voita's random init is not a no-op)
    assert all(torch.equal(g.eval_gates(), torch.ones(4)) for g in l0.values())
    add_mixers(model)
    assert torch.equal(_generate(model, inputs), before)
    model.train()  # L0 gates sample in training; evaluation must be deterministic again afterwards
    model.eval()
    assert torch.equal(_generate(model, inputs), before)


@pytest.mark.parametrize("family", SEQ2SEQ)
def test_surgery_in_every_kind_equals_masking_and_reloads(family, tmp_path):
    inputs, _, tgt = seq2seq_inputs(family)
    masked, pruned = tiny_seq2seq(family), tiny_seq2seq(family)
    apply_masks(masked, {name: [0 if h in heads else 1 for h in range(4)] for name, heads in PLAN.items()})
    headwise.prune_heads(pruned, PLAN)
    assert {s.name: s.num_heads for s in find_sites(pruned)} == {n: 4 - len(h) for n, h in PLAN.items()}
    with torch.no_grad():
        want = masked(**inputs).logits
        got = pruned(**inputs).logits
        probs = pruned(**inputs, output_attentions=True).logits
    torch.testing.assert_close(got[tgt], want[tgt], **CLOSE)
    torch.testing.assert_close(probs[tgt], want[tgt], **CLOSE)
    tokens = _generate(pruned, inputs)
    assert torch.equal(tokens, _generate(masked, inputs))
    assert torch.equal(tokens, _generate(pruned, inputs, cache=False))

    headwise.save_pretrained(pruned, tmp_path / "pruned")
    reloaded = headwise.from_pretrained(tmp_path / "pruned")
    assert type(reloaded) is type(pruned)
    with torch.no_grad():
        assert torch.equal(reloaded(**inputs).logits, got)
    assert torch.equal(_generate(reloaded, inputs), tokens)


@pytest.mark.parametrize("family", SEQ2SEQ)
def test_one_kind_surgery_equals_masking(family):
    inputs, _, tgt = seq2seq_inputs(family)
    for kind in KINDS:
        plan = {f"{kind}.0": [0, 2], f"{kind}.1": [3]}
        masked, pruned = tiny_seq2seq(family), tiny_seq2seq(family)
        apply_masks(masked, {kind: [[0, 1, 0, 1], [1, 1, 1, 0]]})  # Voita's per-kind alive_heads table
        headwise.prune_heads(pruned, plan)
        with torch.no_grad():
            want = masked(**inputs).logits
            torch.testing.assert_close(pruned(**inputs).logits[tgt], want[tgt], **CLOSE)
        assert torch.equal(_generate(pruned, inputs), _generate(masked, inputs)), kind
        assert prune_masked(masked) == plan  # masks become physical removal in that kind only
        with torch.no_grad():
            torch.testing.assert_close(masked(**inputs).logits[tgt], want[tgt], **CLOSE)


@pytest.mark.parametrize("family", SEQ2SEQ)
def test_gated_model_reloads_exactly(family, tmp_path):
    inputs, _, _ = seq2seq_inputs(family)
    model = tiny_seq2seq(family)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for gate in add_gates(model).values():
            gate.weight.copy_(torch.rand(gate.weight.shape, generator=g))
        for mixer in add_mixers(model, MixingConfig(kinds=["dec-enc"])).values():
            mixer.alpha.add_(0.1 * torch.randn(mixer.alpha.shape, generator=g))
        before = model(**inputs).logits
    headwise.save_pretrained(model, tmp_path / "gated")
    loaded = headwise.from_pretrained(tmp_path / "gated")
    with torch.no_grad():
        assert torch.equal(loaded(**inputs).logits, before)
    assert torch.equal(_generate(loaded, inputs), _generate(model, inputs))


@pytest.mark.parametrize("family", SEQ2SEQ)
def test_methods_restricted_to_a_kind_touch_only_that_kind(family):
    model = tiny_seq2seq(family)
    by_kind = {k: {s.path for s in find_sites(model) if s.kind == k} for k in KINDS}
    assert set(add_l0_gates(model, L0Config(kinds=["dec-enc"]))) == by_kind["dec-enc"]
    mixers = add_mixers(model, MixingConfig(kinds=["enc-self", "dec-self"]))
    assert set(mixers) == by_kind["enc-self"] | by_kind["dec-self"]
    assert set(apply_masks(model, {"dec-self": [[1, 0, 1, 1], [1, 1, 1, 1]]})) == by_kind["dec-self"]
    assert {s.path for s in select_sites(model, ["enc-self"])} == by_kind["enc-self"]


def test_unknown_kind_names_the_kinds_the_model_has():
    with pytest.raises(headwise.HeadwiseError, match=r"no 'dec-enc' attention; its kinds: enc-self$"):
        add_l0_gates(tiny_model("bert"), L0Config(kinds=["dec-enc"]))
    model = tiny_seq2seq("marian")
    with pytest.raises(headwise.HeadwiseError, match="no 'enc_self' attention; its kinds: dec-enc, dec-self, enc-self"):
        add_l0_gates(model, L0Config(kinds=["enc_self"]))
    with pytest.raises(headwise.HeadwiseError, match="unknown attention kind 'enc_self'; use any of enc-self"):
        add_mixers(model, MixingConfig(kinds=["enc_self"]))
    with pytest.raises(headwise.HeadwiseError, match="no 'dec-enc' attention; its kinds: enc-self$"):
        add_mixers(tiny_model("bert"), MixingConfig(kinds=["dec-enc"]))
    with pytest.raises(headwise.HeadwiseError, match="no 'dec-self' attention; its kinds: enc-self$"):
        dropin.use(tiny_model("bert"), "linear", selection=Selection(kinds=["dec-self"]))
    with pytest.raises(headwise.HeadwiseError, match="kinds: enc-self, dec-self, dec-enc"):
        apply_masks(model, {"cross": [[1, 1, 1, 1]] * 2})
    assert all(headwise.runtime.ops_of(s) is None for s in find_sites(model))  # nothing was attached


def test_swap_between_encoder_and_decoder_with_different_head_dims_is_refused():
    model = tiny_seq2seq("bart", decoder_attention_heads=2)  # encoder heads 8 wide, decoder heads 16 wide
    shapes = {s.kind: s.head_dim for s in find_sites(model)}
    assert shapes == {"enc-self": 8, "dec-self": 16, "dec-enc": 16}
    state = _state(model)
    for swap in ("enc-self.0:1 <-> dec-self.0:1", "enc-self.1:0 <-> dec-enc.1:1"):
        with pytest.raises(headwise.HeadwiseError, match=r"head shapes differ \(enc-self.\d: head_dim 8.*head_dim 16"):
            swap_heads(model, ["enc-self.0:0 <-> enc-self.1:2", swap])  # the valid first swap must not run either
    assert _same_state(model, state)


@pytest.mark.parametrize("family", SEQ2SEQ)
def test_swaps_within_each_kind_and_across_kinds(family):
    model = tiny_seq2seq(family)
    inputs, _, tgt = seq2seq_inputs(family)
    state = _state(model)
    with pytest.raises(headwise.HeadwiseError, match="different attention kinds"):
        swap_heads(model, ["enc-self.0:0 <-> dec-self.0:0"])  # same shapes, different kinds
    assert _same_state(model, state)
    swaps = [HeadSwap(f"{k}.0", 1, f"{k}.1", 2) for k in KINDS]
    with torch.no_grad():
        before = model(**inputs).logits
        swap_heads(model, swaps, include_output=True)
        moved = model(**inputs).logits
        assert not torch.allclose(moved[tgt], before[tgt])
        undo_swaps(model, swaps, include_output=True)
    assert _same_state(model, state)


@pytest.mark.parametrize("family", SEQ2SEQ)
def test_mechanisms_are_refused_where_unsound(family):
    model = tiny_seq2seq(family)
    with pytest.raises(headwise.HeadwiseError, match="cross-attention"):
        dropin.use(model, "linear", selection=Selection(names=["dec-enc.0"]))
    if family == "t5":
        with pytest.raises(headwise.HeadwiseError, match="relative position bias"):
            dropin.use(model, "linear", selection=Selection(names=["enc-self.0"]))
        return
    inputs, _, tgt = seq2seq_inputs(family)
    with torch.no_grad():
        want = model(**inputs).logits
    tokens = _generate(model, inputs)
    with pytest.raises(headwise.HeadwiseError, match="cross-attention"):
        dropin.use(model, "softmax", selection=Selection(kinds=["dec-enc"]))
    assert set(dropin.use(model, "softmax", selection=Selection(kinds=["enc-self", "dec-self"]))) == {
        s.path for s in find_sites(model) if s.kind != "dec-enc"}
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits[tgt], want[tgt], **CLOSE)
    assert torch.equal(_generate(model, inputs), tokens)  # the causal mechanism under the KV cache


@pytest.mark.parametrize("family", SEQ2SEQ)
def test_collaborative_self_attention_is_exact_and_reloads(family, tmp_path):
    from headwise.collaborative import CollaborativeConfig, compress, is_collaborative

    model = tiny_seq2seq(family)
    inputs, _, tgt = seq2seq_inputs(family)
    with torch.no_grad():
        want = model(**inputs).logits
    tokens = _generate(model, inputs)
    state = _state(model)
    exact = 24 if family == "t5" else 32  # H·d
    if family == "t5":  # T5's collaborative forward is self-attention only
        with pytest.raises(headwise.HeadwiseError, match="dec-enc.0 is cross-attention.*only for bart, marian.*kinds="):
            compress(model, dk=exact)
        assert _same_state(model, state)
    compress(model, config=CollaborativeConfig(dk=exact, kinds=["enc-self", "dec-self"]))
    assert [is_collaborative(s.module) for s in find_sites(model)] == [True] * 4 + [False] * 2
    with torch.no_grad():
        got = model(**inputs).logits
    torch.testing.assert_close(got[tgt], want[tgt], **CLOSE)
    assert torch.equal(_generate(model, inputs), tokens)
    headwise.save_pretrained(model, tmp_path / "collab")
    with torch.no_grad():
        assert torch.equal(headwise.from_pretrained(tmp_path / "collab")(**inputs).logits, got)


@pytest.mark.parametrize("family", ["bart", "marian"])
def test_collaborative_cross_attention_is_exact_under_the_cache_and_reloads(family, tmp_path):
    """Every kind collaborative at dk = H·d (query from the decoder, shared key and values from the encoder): the
    logits and the cached greedy generation of the original model; save/reload keeps them."""
    from headwise.collaborative import compress, is_collaborative

    model = tiny_seq2seq(family)
    with torch.no_grad():  # a query bias, so the content bias c_h (key side: encoder states) is not zero
        for site in find_sites(model):
            site.q.module.bias.normal_(0.0, 0.5)
    inputs, _, tgt = seq2seq_inputs(family)
    with torch.no_grad():
        want = model(**inputs).logits
    tokens = _generate(model, inputs)
    compress(model, dk=32)
    assert all(is_collaborative(s.module) for s in find_sites(model))
    with torch.no_grad():
        got = model(**inputs).logits
    torch.testing.assert_close(got[tgt], want[tgt], **CLOSE)
    assert torch.equal(_generate(model, inputs), tokens) and torch.equal(_generate(model, inputs, cache=False), tokens)
    headwise.save_pretrained(model, tmp_path / "collab")
    with torch.no_grad():
        assert torch.equal(headwise.from_pretrained(tmp_path / "collab")(**inputs).logits, got)


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-2), (torch.bfloat16, 8e-2)], ids=str)
def test_collaborative_cross_attention_in_half_precision(dtype, tol):
    from headwise.collaborative import CollaborativeConfig, compress

    inputs, _, tgt = seq2seq_inputs("marian")
    model = tiny_seq2seq("marian")
    compress(model, config=CollaborativeConfig(dk=12, kinds=["dec-enc"]))
    with torch.no_grad():
        reference = model(**inputs).logits
        low = model.to(dtype)(**inputs).logits
    assert low.dtype == dtype
    scale = reference[tgt].abs().max()
    torch.testing.assert_close(low[tgt].float() / scale, reference[tgt] / scale, rtol=tol, atol=tol)


def test_collaborative_cross_attention_on_the_meta_device():
    """The collaborative cross-attention forward creates nothing on the CPU: the converted module on ``meta``, with
    and without an ``EncoderDecoderCache`` (transformers' own mask code reads masks with ``.item()``, so the module
    is called directly)."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    from headwise.collaborative import CollaborativeConfig, compress

    inputs, _, _ = seq2seq_inputs("marian")
    model = tiny_seq2seq("marian")
    compress(model, config=CollaborativeConfig(dk=12, kinds=["dec-enc"]), calibration=[inputs] * 4)
    site = next(s for s in find_sites(model) if s.kind == "dec-enc")
    module = site.module.to("meta")
    queries, keys = torch.randn(3, 5, 32, device="meta"), torch.randn(3, 7, 32, device="meta")
    mask = torch.ones(3, 1, 5, 7, dtype=torch.bool, device="meta")
    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    with torch.no_grad():
        for past in (None, cache, cache):  # the second cached call reuses the stored key and values
            out, _ = module(queries, key_value_states=keys, attention_mask=mask, **{CACHE: past})
            assert out.device.type == "meta" and out.shape == (3, 5, 32)
    assert cache.is_updated[site.module.layer_idx]


def test_cross_attention_moments_take_queries_from_the_decoder_and_keys_from_the_encoder():
    from headwise.collaborative import input_moments

    model = tiny_seq2seq("marian")
    inputs, src, tgt = seq2seq_inputs("marian")
    sites = [s for s in find_sites(model) if s.kind == "dec-enc"]
    seen = {}

    def keep_first_inputs(name):
        def hook(module, args, kwargs):
            seen.setdefault(name, (args[0] if args else kwargs["hidden_states"], kwargs["key_value_states"]))
        return hook

    hooks = [s.module.register_forward_pre_hook(keep_first_inputs(s.name), with_kwargs=True) for s in sites]
    moments = input_moments(model, sites, [inputs] * 3)
    for hook in hooks:
        hook.remove()
    for site in sites:
        queries, keys = seen[site.name]
        x = queries[tgt].double()
        torch.testing.assert_close(moments[site.path][0], x.T @ x / len(x), msg=site.name)
        centred = [keys[b][src[b]].double() - keys[b][src[b]].double().mean(0) for b in range(len(src))]
        y = torch.cat(centred)
        torch.testing.assert_close(moments[site.path][1], y.T @ y / len(y), msg=site.name)


@pytest.mark.parametrize("family", SEQ2SEQ)
def test_whole_head_swap_inside_a_site_permutes_heads_except_t5_bias(family):
    """Swapping two heads of one site with their output columns only reorders the heads: nothing changes, except in
    T5's self-attention, whose position bias belongs to the head slot and does not move with the weights."""
    inputs, _, tgt = seq2seq_inputs(family)
    for kind in KINDS:
        model = tiny_seq2seq(family)
        with torch.no_grad():
            before = model(**inputs).logits
            swap_heads(model, [f"{kind}.1:0 <-> {kind}.1:3"], include_output=True)
            after = model(**inputs).logits
        if family == "t5" and kind != "dec-enc":
            assert not torch.allclose(after[tgt], before[tgt], atol=1e-3), kind
        else:
            torch.testing.assert_close(after[tgt], before[tgt], **CLOSE, msg=kind)


def test_calibration_moments_use_each_side_s_padding():
    from headwise.collaborative import input_moments

    model = tiny_seq2seq("bart")
    inputs, src, tgt = seq2seq_inputs("bart")
    sites = [s for s in find_sites(model) if s.kind != "dec-enc"]
    seen = {}

    def keep_first_input(name):
        def hook(module, args):
            seen.setdefault(name, args[0])
        return hook

    hooks = [s.module.register_forward_pre_hook(keep_first_input(s.name)) for s in sites]
    moments = input_moments(model, sites, [inputs] * 3)
    for hook in hooks:
        hook.remove()
    for site in sites:
        x = seen[site.name][src if site.kind == "enc-self" else tgt].double()
        torch.testing.assert_close(moments[site.path][0], x.T @ x / len(x), msg=site.name)
