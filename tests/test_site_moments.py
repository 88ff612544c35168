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
