"""The gate algebra: every variant multiplies head outputs by ``values()``, folds by ``inference()``, and
``prune_masked`` asks the protocol only. Checkpoint records and state-dict keys stay what earlier versions wrote."""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_inputs, tiny_model

import headwise
from headwise.pruning import add_l0_gates, apply_masks, prune_masked
from headwise.runtime import Gate, HardConcreteGate, HeadGate, HeadMask, RowGate, add_gates, attach
from headwise.sites import find_sites

H = 4


def _variants() -> dict[str, Gate]:
    scale = HeadGate(H)
    scale.weight.data = torch.tensor([0.5, 0.0, 2.0, 1.0])
    mask = HeadMask(H)
    mask.mask.copy_(torch.tensor([1.0, 0.0, 1.0, 1.0]))
    l0 = HardConcreteGate(H, init=0.0)
    l0.log_alpha.data = torch.tensor([3.0, -5.0, 0.0, 1.0])
    return {"scale": scale, "mask": mask, "l0": l0.eval()}


@pytest.mark.parametrize("name", ["scale", "mask", "l0"])
def test_each_variant_multiplies_every_head_by_its_inference_value(name):
    gate = _variants()[name]
    out = torch.randn(2, 3, H, 5)
    factor = gate.inference().detach()
    assert factor.shape == (H,) and factor[1] == 0
    expected = torch.stack([out[:, :, h] * float(factor[h]) for h in range(H)], dim=2)
    torch.testing.assert_close(gate(out), expected, rtol=0, atol=0)
    weight = torch.randn(H, 6, 5)
    folded = weight.clone()
    gate.fold(folded)
    torch.testing.assert_close(folded, weight * factor[:, None, None], rtol=0, atol=0)


def test_hard_concrete_draws_in_training_and_row_gate_cannot_fold():
    gate = HardConcreteGate(H, init=0.0).train()
    torch.manual_seed(0)
    draws = torch.stack([gate.values() for _ in range(20)])
    assert draws.std(0).min() > 0 and draws.min() >= 0 and draws.max() <= 1
    row = RowGate(2, H)
    row.weight = torch.tensor([[[1.0, 0.0, 1.0, 1.0]], [[0.0, 1.0, 1.0, 1.0]]])
    out = torch.ones(1, 2, H, 3)
    assert row(out)[0, :, 1].abs().sum() == 0 and row(out)[0, :, 0].abs().sum() == 0  # layer 0, then layer 1
    assert row.inference() is None
    with pytest.raises(TypeError, match="cannot be folded"):
        row.fold(torch.ones(H, 2))


def test_prune_masked_folds_any_gate_of_the_protocol():
    """A gate type finalize has never heard of is folded through the protocol alone."""

    class Halves(Gate):
        def values(self):
            return torch.tensor([0.5, 0.0, 0.5, 1.0])

        inference = values

    model = tiny_model("bert")
    inputs, _ = tiny_inputs("bert")
    site = find_sites(model)[0]
    attach(site, "output", "halves", Halves())
    with torch.no_grad():
        gated = model(**inputs).last_hidden_state
    assert prune_masked(model) == {site.name: [1]}
    assert find_sites(model)[0].num_heads == H - 1
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).last_hidden_state, gated, rtol=1e-5, atol=1e-5)


def test_checkpoint_records_and_state_dict_keys_are_stable(tmp_path):
    """What a checkpoint of earlier versions holds: op types ``gate``/``mask``/``hard_concrete`` and the keys
    ``weight``/``mask``/``log_alpha``; such a folder reloads exactly."""
    model = tiny_model("bert")
    add_gates(model)
    apply_masks(model, {"enc-self.0": [1, 0, 1, 1]})
    add_l0_gates(model)
    path = find_sites(model)[0].path
    keys = {k for k in model.state_dict() if k.startswith(path + ".headwise.")}
    assert keys == {f"{path}.headwise.output.{k}" for k in ("gate.weight", "mask.mask", "l0.log_alpha")}
    headwise.save_pretrained(model, tmp_path / "m")
    records = model.config.headwise["ops"]
    assert {(r["name"], r["type"]) for r in records if r["site"] == path} == {
        ("gate", "gate"), ("mask", "mask"), ("l0", "hard_concrete")}
    assert [r["spec"] for r in records if r["name"] == "mask"][0] == {"num_heads": H}
    reloaded = headwise.from_pretrained(tmp_path / "m")
    inputs, _ = tiny_inputs("bert")
    with torch.no_grad():
        assert torch.equal(reloaded(**inputs).last_hidden_state, model(**inputs).last_hidden_state)
    assert isinstance(headwise.runtime.ops_of(find_sites(reloaded)[0]).output["l0"], HardConcreteGate)
