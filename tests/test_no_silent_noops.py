"""No silent no-ops: every ``add_*`` / ``apply_*`` works on a plain eager model (it selects the ``headwise``
implementation itself). Attached at identity it changes nothing; with head 0 of the first site zeroed it matches
an independent reference: the eager model whose output projection has that head's columns zeroed."""

from __future__ import annotations

import copy

import pytest
import torch
from test_analysis_support import loud_model
from tiny import tiny_inputs, tiny_model

from headwise import HeadwiseError, Selection
from headwise.collaborative import compress
from headwise.mixing import MixingConfig, add_mixers
from headwise.pruning import L0Config, add_l0_gates, apply_masks
from headwise.quantization import quantize_attention
from headwise.runtime import NAME, add_gates
from headwise.sites import find_sites, select_sites


def _zero_head_0(model, add: str) -> None:
    site = find_sites(model)[0]
    if add == "add_gates":
        add_gates(model)[site.path].weight.data[0] = 0
    elif add == "add_l0_gates":
        add_l0_gates(model, L0Config(init=10.0))[site.path].log_alpha.data[0] = -10.0
    elif add == "apply_masks":
        apply_masks(model, {site.name: [0] + [1] * (site.num_heads - 1)})
    elif add == "add_mixers":
        add_mixers(model, MixingConfig())[site.path].alpha.data[0, 0] = 0


def _identity(model, add: str) -> None:
    {"add_gates": lambda: add_gates(model), "add_l0_gates": lambda: add_l0_gates(model, L0Config(init=10.0)),
     "apply_masks": lambda: apply_masks(model, {}), "add_mixers": lambda: add_mixers(model)}[add]()


ADDS = ["add_gates", "add_l0_gates", "apply_masks", "add_mixers"]


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
@pytest.mark.parametrize("add", ADDS)
def test_each_add_on_an_eager_model_changes_the_output_when_a_head_is_zeroed(family, add):
    eager = tiny_model(family, attn="eager")
    inputs, real = tiny_inputs(family)
    with torch.no_grad():
        before = eager(**inputs).last_hidden_state
        reference = copy.deepcopy(eager)
        find_sites(reference)[0].o.weight[0] = 0  # head 0's columns of W^O: the head's contribution removed
        expected = reference(**inputs).last_hidden_state
    assert not torch.allclose(expected[real], before[real], atol=1e-4)

    untouched = copy.deepcopy(eager)
    _identity(untouched, add)
    assert untouched.config._attn_implementation == NAME
    _zero_head_0(eager, add)
    assert eager.config._attn_implementation == NAME
    with torch.no_grad():
        torch.testing.assert_close(untouched(**inputs).last_hidden_state[real], before[real], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(eager(**inputs).last_hidden_state[real], expected[real], rtol=1e-5, atol=1e-5)


def test_quantize_attention_and_compress_change_an_eager_model():
    """quantize_attention selects the implementation; compress swaps the attention class (which runs the headwise
    attention itself), so both act on an eager model. Loud weights: attention far from uniform."""
    inputs, real = tiny_inputs("bert")
    for edit in (lambda m: quantize_attention(m, quantizer="binarization"), lambda m: compress(m, dk=1)):
        model = loud_model("bert", attn="eager")
        with torch.no_grad():
            before = model(**inputs).last_hidden_state
        edit(model)
        with torch.no_grad():
            after = model(**inputs).last_hidden_state
        assert not torch.allclose(after[real], before[real], atol=1e-2)


def test_a_model_that_cannot_use_headwise_raises_a_clear_error():
    class Plain(torch.nn.Module):  # a module transformers cannot switch: no config, no set_attn_implementation
        config = type("C", (), {"_attn_implementation": "eager"})()

    from headwise.runtime import enable

    with pytest.raises(HeadwiseError, match="cannot select the headwise attention implementation"):
        enable(Plain())


def test_select_sites_by_kind_layer_and_name():
    model = tiny_model("bert")
    sites = find_sites(model)
    assert select_sites(model) == sites
    assert select_sites(model, ["enc-self"], layers=[1]) == [sites[1]]
    assert select_sites(model, names=[sites[0].name, sites[1].path]) == sites[:2]
    with pytest.raises(HeadwiseError, match="no 'dec-self' attention; its kinds: enc-self"):
        select_sites(model, ["dec-self"])
    with pytest.raises(HeadwiseError, match="no attention site serves layer 7"):
        select_sites(model, layers=[7])
    with pytest.raises(HeadwiseError, match="no attention site 'nope'"):
        add_gates(model, selection=Selection(names=["nope"]))
    assert "headwise" not in dict(model.named_modules()).get(sites[0].path).__dict__["_modules"]  # nothing attached
