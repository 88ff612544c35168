"""Device safety of data-aware collaborative compression: calibration moments live on the model's device."""

import torch
from tiny import tiny_inputs, tiny_model

import headwise
from headwise.collaborative import input_moments
from headwise.collaborative.decompose import whitening


def _on_meta(family):
    """The tiny model and its inputs on ``meta`` (no attention mask: transformers reads masks with ``.item()``)."""
    model = tiny_model(family).to("meta")
    inputs, _ = tiny_inputs(family)
    return model, {k: v.to("meta") for k, v in inputs.items() if torch.is_tensor(v) and k != "attention_mask"}


def test_calibration_moments_stay_on_the_meta_device():
    model, inputs = _on_meta("bert")
    sites = headwise.find_sites(model)
    moments = input_moments(model, sites, [inputs] * 20)
    for query, key in moments.values():
        assert query.device.type == "meta" and key.device.type == "meta" and query.dtype == torch.float64


def test_calibration_moments_meet_the_weights_on_their_device():
    """The moments feed the whitening of the data-aware objective next to the site's (device) weights."""
    model, inputs = _on_meta("distilbert")
    site = headwise.find_sites(model)[0]
    query, key = input_moments(model, [site], [inputs] * 20)[site.path]
    lower, inverse = whitening(query, 1e-2)
    assert lower.device == site.q.weight.device == inverse.device
