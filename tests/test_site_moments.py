"""``runtime.site_moments`` against the hidden states the model returns: for BERT the input of layer ``l``'s
attention is ``hidden_states[l]``, so the moments are plain averages over its real tokens."""

from __future__ import annotations

import pytest
import torch

import headwise
from headwise.runtime import site_moments
from tiny import tiny_inputs, tiny_model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_moments_equal_averages_of_the_real_tokens(dtype):
    model = tiny_model("bert").to(dtype)
    inputs, real = tiny_inputs("bert")
    sites = headwise.find_sites(model)
    moments = site_moments(model, sites, [inputs], keys=True)
    with torch.no_grad():
        hidden = model(**inputs, output_hidden_states=True).hidden_states
    for site in sites:
        x = hidden[site.layer].double()
        tokens = x[real]  # [N, D]
        m = moments[site.path]
        assert m.tokens == int(real.sum())
        torch.testing.assert_close(m.xx, tokens.T @ tokens / len(tokens))
        torch.testing.assert_close(m.x, tokens.mean(0))
        centred = torch.cat([x[b][real[b]] - x[b][real[b]].mean(0) for b in range(len(x))])
        torch.testing.assert_close(m.kk, centred.T @ centred / len(centred))


def test_moments_on_meta_have_shapes_and_counts():
    """On ``meta`` (no values) the pass still runs and counts tokens on the host."""
    model = tiny_model("llama").to("meta")
    sites = headwise.find_sites(model)
    moments = site_moments(model, sites, [torch.randint(2, 90, (2, 5))])
    m = moments[sites[0].path]
    assert m.xx.shape == (32, 32) and m.xx.is_meta and m.kk is None and m.tokens == 10


def test_a_causal_lm_s_calibration_pass_fills_no_key_value_cache():
    """The pass never reads a cache: a decoder whose config asks for one (``use_cache``) runs without it (at 256
    tokens on SmolLM2 every layer's keys and values were 0.17x the weights, the largest tensors of a plan's
    calibration), and the moments equal those of a pass that filled one."""
    model = tiny_model("llama")
    assert model.config.use_cache
    caches = []
    model.register_forward_pre_hook(lambda module, args, kwargs: caches.append(kwargs.get("use_cache")),
                                    with_kwargs=True)
    sites = headwise.find_sites(model)
    ids = torch.randint(2, 90, (2, 7))
    got = site_moments(model, sites, [ids])
    assert caches == [False]
    kept = site_moments(model, sites, [{"input_ids": ids, "use_cache": True}])
    for site in sites:
        torch.testing.assert_close(got[site.path].xx, kept[site.path].xx)


def test_a_group_s_sums_are_freed_before_the_next_group_is_read():
    """``moments_in_groups`` (one site a group here): once the consumer asks for the next group, the dict it was
    given is emptied and the sums in it are gone before the next calibration pass reads a site."""
    import weakref

    from headwise.runtime.moments import moments_in_groups

    model = tiny_model("llama")
    sites = headwise.find_sites(model)
    earlier: list[weakref.ref] = []
    alive_at_read = []
    for site in sites:
        site.module.register_forward_pre_hook(lambda *_: alive_at_read.append([r() is not None for r in earlier]))
    groups = moments_in_groups(model, sites, [torch.randint(2, 90, (2, 7))], share=1e-9)
    for group, found in groups:
        assert len(group) == 1 and set(found) == {group[0].path}
        earlier.append(weakref.ref(found[group[0].path].xx))
    assert len(earlier) == len(sites) > 1 and not found
    assert all(not any(alive) for alive in alive_at_read if alive), alive_at_read


@pytest.mark.parametrize("family", ["bert", "llama", "marian"])
def test_a_batch_read_in_slices_gives_the_moments_of_the_whole_batch(family, monkeypatch):
    """Each calibration batch runs in slices of examples (a forward's MLP intermediates stay within a share of the
    weights); padded rows, masks and an encoder-decoder's two sides are cut together, so the sums equal those of
    one forward of the whole batch (to float32 rounding: a smaller batch can take other kernels), with one forward
    per slice."""
    from headwise.runtime import moments
    from tiny import seq2seq_inputs, tiny_seq2seq

    if family == "marian":
        model, inputs = tiny_seq2seq("marian", attn="sdpa"), seq2seq_inputs("marian")[0]
    else:
        model, inputs = tiny_model(family), tiny_inputs(family)[0]
    sites = headwise.find_sites(model)
    whole = site_moments(model, sites, [inputs], keys=True)
    calls = []
    model.register_forward_pre_hook(lambda module, args, kwargs: calls.append(1), with_kwargs=True)
    monkeypatch.setattr(moments, "MIN_SLICE_TOKENS", 1)
    monkeypatch.setattr(moments, "FORWARD_SHARE", 0.0)
    sliced = site_moments(model, sites, [inputs], keys=True)
    assert len(calls) == len(inputs["input_ids"])
    for site in sites:
        a, b = sliced[site.path], whole[site.path]
        assert a.tokens == b.tokens
        for got, want in ((a.xx, b.xx), (a.x, b.x), (a.kk, b.kk)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_slice_size_keeps_a_forward_within_its_share_of_the_weights():
    """Hand-computed: SmolLM2-135M's shape (D 576, MLP 1,536, float32, 134.5M weights): 1/32 of 538 MB over
    ``4·1536·4`` bytes a token is 684 tokens, two 256-token windows; a short-sequence batch is never cut below
    ``MIN_SLICE_TOKENS``."""
    from types import SimpleNamespace

    from torch import nn

    from headwise.runtime.moments import slice_size

    model = nn.Module()
    model.config = SimpleNamespace(hidden_size=576, intermediate_size=1536)
    model.w = nn.Parameter(torch.empty(134_515_008, device="meta"))
    assert slice_size(model, 8, 256) == 2  # 134,515,008·4/32 // (4·1536·4) = 684 tokens
    assert slice_size(model, 64, 12) == 57  # 684 // 12
    assert slice_size(model, 3, 12) == 3
    model.config = SimpleNamespace(d_model=16, decoder_ffn_dim=64)  # Marian's names
    model.w = nn.Parameter(torch.empty(1_000_000, device="meta"))
    assert slice_size(model, 64, 100) == 5  # max(512, 4e6/32 // 1024 = 122) = 512 tokens
