"""Every registered method on a model dispatched by Accelerate with one layer in CPU memory and one offloaded to
disk (issue 72): a tiny Llama and a tiny BERT give the outputs of the same model loaded whole (float32, 1e-5) after
apply, after remove (the dispatch as it was: the same hooks, the same offloaded weights, no op left) and after
save and a dispatched reload; a method that rewrites offloaded weights refuses in one line before changing
anything. The saved folder is the one the whole model writes."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from tiny import tiny_inputs, tiny_model

import headwise
from headwise import HeadwiseError
from headwise.contract import METHODS, load_methods, measured
from headwise.sites import find_sites

pytest.importorskip("accelerate")
load_methods()

# one attention layer kept in CPU memory, the other offloaded to disk (with the embeddings and the rest on the CPU)
DEVICE_MAPS = {
    "llama": {"embed_tokens": "cpu", "layers.0": "cpu", "layers.1": "disk", "norm": "cpu", "rotary_emb": "cpu"},
    "bert": {"embeddings": "cpu", "encoder.layer.0": "cpu", "encoder.layer.1": "disk", "pooler": "cpu"},
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    out = {}
    for family in DEVICE_MAPS:
        out[family] = tmp_path_factory.mktemp(family)
        tiny_model(family).save_pretrained(out[family])
    return out


def _load(folders, family, offload=None):
    """The tiny ``family`` model loaded whole, or dispatched by ``DEVICE_MAPS`` with ``offload`` as its folder."""
    extra = {} if offload is None else {"device_map": DEVICE_MAPS[family], "offload_folder": str(offload)}
    return headwise.load_model(str(folders[family]), with_tokenizer=False, **extra)[0]


def _out(model, inputs, real):
    with torch.no_grad(), measured(model):  # a KV policy's cache included
        return model(**inputs).last_hidden_state[real]


def _dispatch(model) -> dict:
    """What Accelerate's dispatch consists of: each hooked module and its hook, and the keys its offloaded weights
    are fetched by."""
    found = {}
    for path, module in model.named_modules():
        hook = getattr(module, "_hf_hook", None)
        if hook is not None:
            weights = getattr(hook, "weights_map", None)
            found[path] = (repr(hook), None if weights is None else sorted(weights))
    return found


def _real_state(model) -> dict:
    return {k: v.clone() for k, v in model.state_dict().items() if not v.is_meta}


@pytest.mark.parametrize("family", sorted(DEVICE_MAPS))
@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_on_a_dispatched_model_equals_the_whole_one(name, family, folders, tmp_path):
    method = METHODS[name]
    whole, disp = _load(folders, family), _load(folders, family, tmp_path / "offload")
    assert any(p.is_meta for p in disp.parameters()) and "disk" in disp.hf_device_map.values()
    inputs, real = tiny_inputs(family)
    before = _out(whole, inputs, real)
    assert torch.allclose(_out(disp, inputs, real), before, atol=1e-5)
    try:
        config = method.example(whole)
        headwise.apply(whole, config)
    except HeadwiseError as refused:  # a method that does not serve the family refuses the dispatched model alike
        with pytest.raises(HeadwiseError) as again:
            headwise.apply(disp, method.example(disp))
        assert str(again.value) == str(refused) and "\n" not in str(refused)
        assert torch.allclose(_out(disp, inputs, real), before, atol=1e-5)
        return
    dispatch, state, meta = _dispatch(disp), _real_state(disp), json.dumps(disp.config.to_dict(), sort_keys=True)
    try:
        headwise.apply(disp, config)
    except HeadwiseError as err:  # only a weight edit of an offloaded layer may refuse, before changing anything
        assert not method.reversible and "offloaded" in str(err) and "\n" not in str(err), str(err)
        assert _dispatch(disp) == dispatch and json.dumps(disp.config.to_dict(), sort_keys=True) == meta
        assert {k: torch.equal(v, state[k]) for k, v in _real_state(disp).items()} == dict.fromkeys(state, True)
        assert torch.allclose(_out(disp, inputs, real), before, atol=1e-5)
        disp = None  # the edit made on the whole model, saved, still reloads dispatched (below)
    edited = _out(whole, inputs, real)
    headwise.save_pretrained(whole, tmp_path / "whole")
    if disp is not None:
        assert torch.allclose(_out(disp, inputs, real), edited, atol=1e-5), f"{name} on {family} differs dispatched"
        # save: the folder the whole model writes
        headwise.save_pretrained(disp, tmp_path / "disp")
        assert json.loads((tmp_path / "disp" / "config.json").read_text()) == \
            json.loads((tmp_path / "whole" / "config.json").read_text())
        saved, expected = (load_file(tmp_path / f / "model.safetensors") for f in ("disp", "whole"))
        assert saved.keys() == expected.keys() and all(torch.equal(saved[k], expected[k]) for k in saved)

    # reload dispatched: the same outputs
    again = headwise.from_pretrained(tmp_path / ("whole" if disp is None else "disp"), device_map=DEVICE_MAPS[family],
                                     offload_folder=str(tmp_path / "again"))
    assert "disk" in again.hf_device_map.values() and any(p.is_meta for p in again.parameters())
    assert torch.allclose(_out(again, inputs, real), edited, atol=1e-5), f"{name} on {family} differs reloaded"

    if disp is not None and method.reversible:  # remove: the outputs and the dispatch as they were
        headwise.remove(disp, name)
        assert torch.allclose(_out(disp, inputs, real), before, atol=1e-5)
        assert _dispatch(disp) == dispatch
        assert all(getattr(s.module, "headwise", None) is None for s in find_sites(disp))


@pytest.mark.parametrize("family", sorted(DEVICE_MAPS))
def test_a_weight_edit_of_the_layer_kept_in_memory_works_dispatched(family, folders, tmp_path):
    """Collaborative heads on the layer Accelerate keeps in CPU memory (its hooks call the swapped class's
    forward): the whole model's outputs, its saved folder, and a dispatched reload."""
    config = headwise.CollaborativeConfig(dk=4, selection=headwise.Selection(layers=[0]))
    whole, disp = _load(folders, family), _load(folders, family, tmp_path / "offload")
    inputs, real = tiny_inputs(family)
    for model in (whole, disp):
        headwise.apply(model, config)
    edited = _out(whole, inputs, real)
    assert torch.allclose(_out(disp, inputs, real), edited, atol=1e-5)
    for name, model in (("whole", whole), ("disp", disp)):
        headwise.save_pretrained(model, tmp_path / name)
    saved, expected = (load_file(tmp_path / f / "model.safetensors") for f in ("disp", "whole"))
    assert saved.keys() == expected.keys() and all(torch.equal(saved[k], expected[k]) for k in saved)
    again = headwise.from_pretrained(tmp_path / "disp", device_map=DEVICE_MAPS[family],
                                     offload_folder=str(tmp_path / "again"))
    assert torch.allclose(_out(again, inputs, real), edited, atol=1e-5)
