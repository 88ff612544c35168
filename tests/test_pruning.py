import json
import math

import pytest
import torch
from tiny import tiny_inputs, tiny_model

import headwise
from headwise.pruning import (HardConcreteGate, L0Config, L0Penalty, L0Training, add_l0_gates, apply_masks, gate_table,
                              l0_keep, load_masks, prune_masked)
from headwise.runtime import add_gates
from headwise.sites import find_sites


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same_state(model, state):
    after = model.state_dict()
    return set(after) == set(state) and all(torch.equal(after[k], state[k]) for k in state)


# Hard-Concrete constants (reference-methods §A.2-A.3, §E.4)
def test_hard_concrete_reference_values():
    gate = HardConcreteGate(4, init=0.0)
    assert torch.allclose(gate.p_open(), torch.full((4,), 1 / (1 + math.exp(-0.1 * 0.33 / 0.1 * math.log(11)))))
    assert gate.p_open()[0].item() == pytest.approx(0.688, abs=5e-4)
    assert torch.allclose(gate.eval_gates(), torch.full((4,), 0.5))
    with torch.no_grad():
        gate.log_alpha.copy_(torch.tensor([-2.40, -2.39, 2.39, 2.40]))
    g = gate.eval_gates()
    assert g[0] == 0 and 0 < g[1] < 0.01 and 0.99 < g[2] < 1 and g[3] == 1


def test_hard_concrete_training_sample_matches_the_formula():
    gate = HardConcreteGate(6, init=0.3).train()
    torch.manual_seed(5)
    sample = gate.sample()
    torch.manual_seed(5)
    u = torch.empty(6).uniform_(1e-6, 1 - 1e-6)
    s = 1 / (1 + torch.exp(-(torch.log(u / (1 - u)) + 0.3) / 0.33))
    torch.testing.assert_close(sample, (s * 1.2 - 0.1).clamp(0, 1))
    out = torch.ones(2, 3, 6, 5)
    torch.manual_seed(5)
    torch.testing.assert_close(gate(out)[0, 0, :, 0], sample)  # one draw per head, shared by the batch


def test_voita_init_range():
    torch.manual_seed(0)
    la = HardConcreteGate(8).log_alpha
    assert la.abs().max() <= math.sqrt(3 / 8) and la.std() > 0.1


def test_penalty_reductions_and_target_mode():
    model = tiny_model("bert")
    add_l0_gates(model, L0Config(init=0.0))
    p_open = 1 / (1 + math.exp(-0.33 * math.log(11)))
    total = L0Penalty(model, L0Training(lam=0.5))(model).item()
    assert total == pytest.approx(0.5 * 8 * p_open, rel=1e-5)  # 2 sites x 4 heads
    mean = L0Penalty(model, L0Training(lam=0.5, reduction="mean_over_modules"))(model).item()
    assert mean == pytest.approx(total / 2, rel=1e-5)

    penalty = L0Penalty(model, L0Training(lam=0.0, target_heads=2, lambda_lr=1.0))
    penalty.step()
    assert penalty.lam == pytest.approx((8 * p_open - 2) / 8, rel=1e-5)  # raised while too many heads are open
    with torch.no_grad():
        for g in penalty.gates:
            g.log_alpha.fill_(-10.0)
    for _ in range(100):
        penalty.step()
    assert penalty.lam == 0.0  # relaxed once under target, never negative
    assert penalty.metrics()["l0_open_heads"] == 0

    ramp = L0Penalty(model, L0Training(lam=0.0, target_heads=2, target_warmup=4))
    assert ramp.target() == 8.0
    ramp.step(), ramp.step()
    assert ramp.target() == 5.0 and ramp.metrics()["l0_target"] == 5.0
    ramp.step(), ramp.step(), ramp.step()
    assert ramp.target() == 2.0


def test_l0_bad_input_leaves_the_model_untouched():
    model = tiny_model("bert")
    state = _state(model)
    with pytest.raises(headwise.HeadwiseError, match="kinds: enc-self"):
        add_l0_gates(model, L0Config(kinds=["dec-enc"]))
    assert _same_state(model, state)


@pytest.mark.parametrize("kwargs,message", [
    (dict(lam=-0.1), "λ must be ≥ 0"), (dict(reduction="mean"), "unknown reduction"),
    (dict(target_heads=0), "target_heads must be ≥ 1"), (dict(lambda_lr=0), "lambda_lr must be > 0"),
])
def test_l0_training_refuses_bad_settings(kwargs, message):
    with pytest.raises(headwise.HeadwiseError, match=message):
        L0Training(**kwargs)


def test_l0_penalty_refuses_a_target_beyond_the_gated_heads():
    model = tiny_model("bert")
    add_l0_gates(model, L0Config(init=0.0))
    with pytest.raises(headwise.HeadwiseError, match="exceeds the 8 gated heads"):
        L0Penalty(model, L0Training(target_heads=9))


def test_l0_keep_picks_the_largest_log_alpha():
    model = tiny_model("bert")
    gates = add_l0_gates(model, L0Config(init=0.0))
    values = [[3.0, -1.0, 0.5, -3.0], [1.0, 2.0, -2.0, 0.0]]
    with torch.no_grad():
        for g, v in zip(gates.values(), values):
            g.log_alpha.copy_(torch.tensor(v))
    assert list(l0_keep(model, keep=3).values()) == [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]]
    assert list(l0_keep(model).values()) == [[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]]  # closed iff ≤ −2.398
    assert list(gate_table(model)) == ["enc-self.0", "enc-self.1"]


def test_kind_tables_and_files_give_the_same_masks(tmp_path):
    table = {"enc-self": [[1, 0, 1, 1], [0, 1, 1, 1]]}
    (tmp_path / "m.json").write_text(json.dumps(table))
    (tmp_path / "m.yaml").write_text("enc-self:\n  - [1, 0, 1, 1]\n  - [0, 1, 1, 1]\n")
    by_site = {"enc-self.0": [1, 0, 1, 1], "enc-self.1": [0, 1, 1, 1]}
    inputs, real = tiny_inputs("bert")
    outs = []
    for spec in (table, load_masks(tmp_path / "m.json"), load_masks(tmp_path / "m.yaml"), by_site):
        model = tiny_model("bert")
        apply_masks(model, spec)
        with torch.no_grad():
            outs.append(model(**inputs).last_hidden_state)
    gated = tiny_model("bert")
    gates = add_gates(gated)
    with torch.no_grad():
        for g, row in zip(gates.values(), by_site.values()):
            g.weight.copy_(torch.tensor(row, dtype=torch.float))
        outs.append(gated(**inputs).last_hidden_state)
    for out in outs[1:]:
        assert torch.equal(out, outs[0])


@pytest.mark.parametrize("spec,message", [
    ({"enc-self.0": [1, 0, 1]}, "has 3 entries"),
    ({"enc-self": [[1, 1, 1, 1]]}, "1 rows"),
    ({"enc-self.0": [1, 0.5, 1, 1]}, "only 0/1"),
    ({"dec-enc": [[1, 1, 1, 1]]}, "kinds: enc-self"),
])
def test_bad_masks_leave_the_model_untouched(spec, message):
    model = tiny_model("bert")
    state = _state(model)
    with pytest.raises(headwise.HeadwiseError, match=message):
        apply_masks(model, {"enc-self.1": [1, 1, 0, 1], **spec})
    assert _same_state(model, state) and all(not hasattr(s.module, "headwise") for s in find_sites(model))


def test_mask_files_that_do_not_parse(tmp_path):
    (tmp_path / "bad.json").write_text('{"enc-self.0": [1, 0,\n')
    with pytest.raises(headwise.HeadwiseError, match=r"bad.json:2:1: not JSON"):
        load_masks(tmp_path / "bad.json")
    with pytest.raises(headwise.HeadwiseError, match="not found"):
        load_masks(tmp_path / "missing.json")


def test_shared_albert_module_needs_identical_rows():
    model = tiny_model("albert")
    with pytest.raises(headwise.HeadwiseError, match="shared by layers"):
        apply_masks(model, {"enc-self": [[1, 1, 0, 1], [1, 1, 0, 1], [1, 0, 1, 1]]})


@pytest.mark.parametrize("family", ["bert", "distilbert", "albert", "gpt2", "llama", "vit"])
def test_prune_masked_after_l0_gates_equals_the_gated_model(family, tmp_path):
    model = tiny_model(family)
    gates = add_l0_gates(model, L0Config(init=0.0))
    with torch.no_grad():  # a mix of closed (-5), fractional (0.3, 1.0) and open (4) gates
        for i, g in enumerate(gates.values()):
            values = [-5.0, -5.0, 0.3, 4.0] if family == "llama" else [-5.0, 0.3, 1.0, 4.0]
            g.log_alpha.copy_(torch.tensor(values[i:] + values[:i] if family != "llama" else values))
    inputs, real = tiny_inputs(family)
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
    removed = prune_masked(model)
    assert sum(len(h) for h in removed.values()) == (2 if family == "llama" else 1) * len(gates)
    with torch.no_grad():
        got = model(**inputs).last_hidden_state
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=0)
    assert all(not hasattr(s.module, "headwise") for s in find_sites(model))
    headwise.save_pretrained(model, tmp_path / "m")
    with torch.no_grad():
        assert torch.equal(headwise.from_pretrained(tmp_path / "m")(**inputs).last_hidden_state, got)


def test_whole_layer_removal_needs_the_flag():
    model = tiny_model("bert")
    apply_masks(model, {"enc-self.0": [0, 0, 0, 0], "enc-self.1": [1, 0, 1, 1]})
    state = _state(model)
    with pytest.raises(headwise.HeadwiseError, match="allow_empty_layers"):
        prune_masked(model)
    assert _same_state(model, state)
    inputs, real = tiny_inputs("bert")
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
    assert prune_masked(model, allow_empty_layers=True) == {"enc-self.0": [0, 1, 2, 3], "enc-self.1": [1]}
    with torch.no_grad():
        got = model(**inputs).last_hidden_state
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=0)
    assert [s.num_heads for s in find_sites(model)] == [1, 3]


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2"])
def test_uniformly_pruned_llama_family_exports_a_plain_checkpoint(family, tmp_path):
    import transformers as tf

    from headwise.io import export_plain

    model = tiny_model(family)
    gates = add_l0_gates(model, L0Config(init=0.0))  # fractional gates get folded, closed groups removed
    with torch.no_grad():
        for g in gates.values():
            g.log_alpha.copy_(torch.tensor([1.0, 0.5, 4.0, 2.0] if family == "qwen2" else [1.0, 0.5, -9.0, -9.0]))
    inputs, real = tiny_inputs(family)
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
    prune_masked(model)
    export_plain(model, tmp_path / "plain")
    plain = tf.AutoModel.from_pretrained(tmp_path / "plain").eval()  # no headwise involved
    assert plain.config.num_attention_heads == (4 if family == "qwen2" else 2)
    assert not hasattr(plain.config, "headwise")
    with torch.no_grad():
        got = plain(**inputs).last_hidden_state
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=0)


PADDED = {"bert": "AutoModel", "roberta": "AutoModel", "electra": "AutoModel", "distilbert": "AutoModel",
          "albert": "AutoModel", "gpt2": "AutoModel", "vit": "AutoModel", "llama": "AutoModel",
          "t5": "AutoModelForSeq2SeqLM", "bart": "AutoModelForSeq2SeqLM"}


@pytest.mark.parametrize("family", sorted(PADDED))
def test_pruned_models_of_every_family_export_plain_with_zero_padded_heads(family, tmp_path):
    """Other heads removed in each layer (Llama: a whole key/value group in one layer only): plain transformers
    loads the folder at the config's head counts and computes the pruned model's outputs."""
    import transformers as tf

    from headwise.io import export_plain, plain_problem
    from tiny import seq2seq_inputs, tiny_seq2seq

    seq2seq = family in ("t5", "bart")
    model = tiny_seq2seq(family) if seq2seq else tiny_model(family)
    made = (seq2seq_inputs if seq2seq else tiny_inputs)(family)
    inputs, real = made[0], made[-1]  # the outputs' real positions (padded queries differ by implementation)
    sites = find_sites(model)
    removed = ({sites[0].name: [0, 1]} if family == "llama" else
               {s.name: [i % s.num_heads, (i + 2) % s.num_heads][: 1 + i % 2] for i, s in enumerate(sites)})
    headwise.prune_heads(model, removed)
    assert plain_problem(model) is None
    with torch.no_grad():
        expected = model(**inputs)[0]
    export_plain(model, tmp_path / "plain")
    plain = getattr(tf, PADDED[family]).from_pretrained(tmp_path / "plain", attn_implementation="eager").eval()
    assert not hasattr(plain.config, "headwise")
    assert [s.num_heads for s in find_sites(plain)] == [s.num_heads for s in find_sites(tiny_seq2seq(family)
                                                        if seq2seq else tiny_model(family))]  # the config's counts
    with torch.no_grad():
        got = plain(**inputs)[0]
    # float32 sums in another order (eager attention over zero-padded heads): 1.5e-5 at 1.56 on an AMD EPYC
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=1e-5)


def test_plain_export_refuses_what_plain_transformers_cannot_hold(tmp_path):
    from headwise.io import export_plain

    gated = tiny_model("bert")
    add_gates(gated)
    with pytest.raises(headwise.HeadwiseError, match="still carry headwise ops"):
        export_plain(gated, tmp_path / "a")
    from test_kvcache import causal_lm, mixed_policy

    with_policy = causal_lm("llama")
    headwise.apply_kv_policy(with_policy, mixed_policy(with_policy))
    with pytest.raises(headwise.HeadwiseError, match=r"generate\(\) builds a headwise cache \(a KV policy\)"):
        export_plain(with_policy, tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_l0_keep_never_empties_a_site():
    model = tiny_model("bert")
    gates = add_l0_gates(model, L0Config(init=0.0))
    with torch.no_grad():
        list(gates.values())[0].log_alpha.copy_(torch.tensor([-9.0, -8.0, -7.0, -6.0]))
    masks = list(l0_keep(model, keep=2).values())
    assert masks[0] == [0.0, 0.0, 0.0, 1.0] and sum(masks[1]) == 1  # the best closed head of site 0 stays
    assert list(l0_keep(model, keep=2, min_per_site=0).values())[0] == [0.0, 0.0, 0.0, 0.0]
    with pytest.raises(headwise.HeadwiseError, match="between 2"):
        l0_keep(model, keep=1)
