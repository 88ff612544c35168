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
