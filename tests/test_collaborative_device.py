"""Device safety of data-aware collaborative compression: calibration moments, decomposition and conversion stay
on the model's device."""

import pytest
import torch
import torch.utils._pytree as pytree
from tiny import tiny_inputs, tiny_model
from torch.utils._python_dispatch import TorchDispatchMode

import headwise
from headwise.collaborative import CollaborativeConfig, compress, input_moments
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


class _CpuTensors(TorchDispatchMode):
    """Records every op that returns a tensor on the CPU (a factory call without ``device=``, a ``.cpu()``)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(t.device.type == "cpu" for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)):
            self.ops.append(str(func))
        return out


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_calibrated_compress_runs_on_the_meta_device(family):
    """Calibration, decomposition (``tol=0``: fixed sweeps, no host sync) and conversion never leave ``meta``;
    the errors stay 0-dim device tensors until reported."""
    model, inputs = _on_meta(family)
    sites = headwise.find_sites(model)
    config = CollaborativeConfig(dk=6, tol=0.0, iterations=3)
    moments = input_moments(model, sites, [inputs] * 20)
    with _CpuTensors() as cpu:  # decomposition and conversion, from the moments
        result = compress(model, config=config, moments=moments, progress=False)
    assert cpu.ops == []
    assert all(s.device_weight_error.device.type == s.device_score_error.device.type == "meta"
               for s in result.sites)
    model, inputs = _on_meta(family)  # the whole calibrated call
    compress(model, config=config, calibration=[inputs] * 20, progress=False)
    assert all(headwise.collaborative.is_collaborative(s.module) for s in headwise.find_sites(model))
    tensors = dict(model.named_parameters()) | dict(model.named_buffers())
    assert tensors and all(t.device.type == "meta" for t in tensors.values()), \
        [n for n, t in tensors.items() if t.device.type != "meta"]
    assert model(**inputs)[0].device.type == "meta"
