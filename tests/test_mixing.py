"""Alpha mixing, folding, swapping and their errors (fast: tiny random models, no data)."""

import json

import pytest
import torch

import headwise
from headwise.errors import HeadwiseError
from headwise.mixing import (DynamicSwap, DynamicSwapConfig, HeadMixer, HeadSwap, NuclearNormPenalty,
                             NuclearNormTraining, SwapSchedule, add_mixers, alpha_table, choose_swaps, fold_mixing,
                             mixers_of, pairwise, swap_heads, undo_swaps)
from headwise.runtime import add_gates
from headwise.sites import find_sites
from tiny import tiny_inputs, tiny_model

MIX_FAMILIES = ["bert", "distilbert", "albert", "gpt2", "llama", "vit"]


def _out(model, inputs, real):
    hidden = model(**inputs).last_hidden_state
    return hidden[: real.shape[0]][real] if hidden.shape[1] == real.shape[1] else hidden


def _random_alphas(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in (m for _, m in mixers_of(model)):
            m.alpha.copy_(torch.eye(m.alpha.shape[0]) + 0.5 * torch.randn(m.alpha.shape, generator=g))


@pytest.mark.parametrize("family", MIX_FAMILIES)
def test_identity_mixing_changes_nothing_and_fold_matches(family):
    model = tiny_model(family)
    inputs, real = tiny_inputs(family)
    with torch.no_grad():
        plain = _out(model, inputs, real)
        add_mixers(model)
        assert torch.equal(_out(model, inputs, real), plain)
        _random_alphas(model)
        mixed = _out(model, inputs, real)
        assert not torch.allclose(mixed, plain, atol=1e-3)
        fold_mixing(model)
        assert not mixers_of(model)
        torch.testing.assert_close(_out(model, inputs, real), mixed, atol=1e-5, rtol=1e-5)
    assert model.config.headwise["journal"][-1]["method"] == "mixing"


def test_mixer_is_the_dense_product():
    mixer = HeadMixer(4)
    with torch.no_grad():
        mixer.alpha.copy_(torch.randn(4, 4, generator=torch.Generator().manual_seed(3)))
    z = torch.randn(2, 5, 4, 3)
    expected = torch.stack([sum(mixer.alpha[i, j] * z[:, :, j] for j in range(4)) for i in range(4)], dim=2)
    torch.testing.assert_close(mixer(z), expected)


def test_save_reload_mixers_and_folded(tmp_path):
    model = tiny_model("bert")
    inputs, real = tiny_inputs("bert")
    add_mixers(model)
    _random_alphas(model)
    with torch.no_grad():
        mixed = _out(model, inputs, real)
    headwise.save_pretrained(model, tmp_path / "mixed")
    again = headwise.from_pretrained(tmp_path / "mixed")
    assert len(mixers_of(again)) == 2
    with torch.no_grad():
        torch.testing.assert_close(_out(again, inputs, real), mixed, atol=0, rtol=0)
    fold_mixing(again)
    headwise.save_pretrained(again, tmp_path / "folded")
    folded = headwise.from_pretrained(tmp_path / "folded")
    assert not mixers_of(folded) and folded.config.headwise["journal"][-1]["method"] == "mixing"
    with torch.no_grad():
        torch.testing.assert_close(_out(folded, inputs, real), mixed, atol=1e-5, rtol=1e-5)


def test_fold_refuses_an_op_after_the_mixer_and_pruning_refuses_mixers():
    model = tiny_model("bert")
    add_mixers(model)
    with pytest.raises(HeadwiseError, match="cannot follow a head removal"):
        headwise.prune_heads(model, {"enc-self.0": [1]})
    add_gates(model)
    with pytest.raises(HeadwiseError, match="runs after the mixer"):
        fold_mixing(model)


def _manual_bert_swap(model, la, ha, lb, hb, d=8):
    """Swap rows of the raw q/k/v Linear weights and biases of two BERT layers (no headwise code)."""
    with torch.no_grad():
        for proj in ("query", "key", "value"):
            a = getattr(model.encoder.layer[la].attention.self, proj)
            b = getattr(model.encoder.layer[lb].attention.self, proj)
            for name in ("weight", "bias"):
                x, y = getattr(a, name), getattr(b, name)
                tmp = x[ha * d:(ha + 1) * d].clone()
                x[ha * d:(ha + 1) * d] = y[hb * d:(hb + 1) * d]
                y[hb * d:(hb + 1) * d] = tmp


def _manual_gpt2_swap(model, la, ha, lb, hb, d=8, width=32):
    """GPT-2's fused Conv1D ``c_attn`` holds q, k, v side by side in its output columns."""
    with torch.no_grad():
        a, b = model.h[la].attn.c_attn, model.h[lb].attn.c_attn
        for part in range(3):
            ca = slice(part * width + ha * d, part * width + (ha + 1) * d)
            cb = slice(part * width + hb * d, part * width + (hb + 1) * d)
            tmp_w, tmp_b = a.weight[:, ca].clone(), a.bias[ca].clone()
            a.weight[:, ca], a.bias[ca] = b.weight[:, cb], b.bias[cb]
            b.weight[:, cb], b.bias[cb] = tmp_w, tmp_b


@pytest.mark.parametrize("family,manual", [("bert", _manual_bert_swap), ("gpt2", _manual_gpt2_swap)])
def test_swap_matches_manual_permutation_and_is_an_involution(family, manual):
    model, reference = tiny_model(family), tiny_model(family)
    inputs, real = tiny_inputs(family)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    kind = find_sites(model)[0].kind
    swaps = [f"{kind}.0:1 <-> {kind}.1:2", HeadSwap(f"{kind}.0", 3, f"{kind}.0", 0)]
    swap_heads(model, swaps)
    manual(reference, 0, 1, 1, 2)
    manual(reference, 0, 3, 0, 0)
    for k, v in reference.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    with torch.no_grad():
        assert not torch.allclose(_out(model, inputs, real), _out(tiny_model(family), inputs, real))
    undo_swaps(model, swaps)
    for k, v in model.state_dict().items():
        assert torch.equal(v, original[k]), k


def test_swap_errors_leave_the_model_untouched():
    model = tiny_model("bert")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for bad, message in [("enc-self.7:0 <-> enc-self.0:0", "no attention site 'enc-self.7'"),
                         ("enc-self.0:0 <-> enc-self.1:4", "has heads 0..3, not 4"),
                         ("enc-self.0:1 <-> enc-self.0:1", "with itself"),
                         ("enc-self.0 and 1", "cannot read swap")]:
        with pytest.raises(HeadwiseError, match=message):
            swap_heads(model, ["enc-self.0:0 <-> enc-self.1:0", bad])
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    attn = model.encoder.layer[1].attention.self  # pretend layer 1 has 2 heads of 16 dims
    attn.num_attention_heads, attn.attention_head_size = 2, 16
    with pytest.raises(HeadwiseError, match="head shapes differ"):
        swap_heads(model, ["enc-self.0:0 <-> enc-self.1:0"])
    with pytest.raises(HeadwiseError, match="grouped-query"):
        swap_heads(tiny_model("llama"), ["dec-self.0:0 <-> dec-self.1:0"])


def test_schedule_errors_name_the_line(tmp_path):
    model = tiny_model("bert")
    path = tmp_path / "swaps.json"
    path.write_text('{\n  "1": ["enc-self.0:0 <-> enc-self.1:0"],\n  "2": [\n'
                    '    "enc-self.0:0 <-> enc-self.1:0",,\n]}\n')
    with pytest.raises(HeadwiseError, match="line 4"):
        SwapSchedule(model, path)
    path.write_text('{\n  "1": ["enc-self.0:0 <-> enc-self.1:0"],\n  "3": ["enc-self.0:0 <-> enc-self.5:0"]\n}\n')
    with pytest.raises(HeadwiseError, match=r"line 3 \(time '3'\): swap .*no attention site 'enc-self.5'"):
        SwapSchedule(model, path)
    mhr = {"s_layer": "0", "s_head": 9, "s_layer_module": "self_attn", "s_transformer_module": "encoder",
           "d_layer": "1", "d_head": 0, "d_layer_module": "self_attn", "d_transformer_module": "encoder"}
    path.write_text(json.dumps({"2": [mhr]}))
    with pytest.raises(HeadwiseError, match="enc-self.0 has heads 0..3, not 9"):
        SwapSchedule(model, path)
    with pytest.raises(HeadwiseError, match="epochs start at 1"):
        SwapSchedule(model, {"0": []})


def test_nuclear_norm_seed_form_value_and_gradient():
    model = tiny_model("bert")
    add_mixers(model)
    _random_alphas(model)
    term = NuclearNormPenalty(model, NuclearNormTraining(gamma=3.0, radius=0.25, form="seed", ratios={"enc-self": 0.5}))
    loss = term(model)
    torch.testing.assert_close(loss, torch.tensor(3.0 * 0.5 * 0.25 * 2))  # value: γ r Δr per module
    loss.backward()
    for m in (m for _, m in mixers_of(model)):
        u, _, vh = torch.linalg.svd(m.alpha.detach())
        torch.testing.assert_close(m.alpha.grad, -3.0 * 0.5 * (u @ vh), atol=1e-5, rtol=1e-4)  # −γ r ∇‖α‖_*


def test_nuclear_norm_radius_form_is_a_hinge_on_the_last_update():
    model = tiny_model("bert")
    add_mixers(model)
    term = NuclearNormPenalty(model, NuclearNormTraining(gamma=1.0, radius=0.1))
    assert abs(float(term(model).detach()) - 0.2) < 1e-6  # no growth yet: Δr per module
    with torch.no_grad():
        for m in (m for _, m in mixers_of(model)):
            m.alpha.mul_(1.02)  # ‖α‖_* grows by 4 × 0.02 = 0.08 < Δr
    assert abs(float(term(model).detach()) - 2 * 0.02) < 1e-5
    with torch.no_grad():
        for m in (m for _, m in mixers_of(model)):
            m.alpha.mul_(1.1)
    assert float(term(model).detach()) == 0.0


def test_start_fraction_freezes_alphas():
    model = tiny_model("bert")
    add_mixers(model)
    term = NuclearNormPenalty(model, NuclearNormTraining(gamma=1.0, start=0.5))
    assert not term.active and all(m.frozen for m in (m for _, m in mixers_of(model)))
    assert float(term(model).detach()) == 0.0
    state = type("S", (), {"max_steps": 10, "global_step": 0})()
    term.on_train_begin(None, state, None)
    state.global_step = 4
    term.on_step_begin(None, state, None)
    assert not term.active
    state.global_step = 5
    term.on_step_begin(None, state, None)
    assert term.active and not any(m.frozen for m in (m for _, m in mixers_of(model)))


def test_choose_swaps_methods():
    table = torch.tensor([[0.9, 0.1, 0.5, 0.3], [0.2, 0.8, 0.7, 0.05], [0.6, 0.4, 0.35, 0.95]])
    assert choose_swaps(table, "hard", 2) == [(2, 3, 1, 3), (0, 0, 0, 1)]
    assert choose_swaps(table, "soft", 1, soft_heads=2) == [(0, 1, 2, 1), (0, 3, 2, 3)]
    assert choose_swaps(table, "soft", 1, soft_heads=2, soft_rank="both") == [(0, 1, 2, 2), (0, 3, 2, 1)]
    pairs = choose_swaps(table, "random", 3, generator=torch.Generator().manual_seed(0))
    heads = [p[:2] for p in pairs] + [p[2:] for p in pairs]
    assert len(set(heads)) == 6
    with pytest.raises(HeadwiseError, match="needs at least 4 layers"):
        choose_swaps(table, "soft", 2)


def test_dynamic_state_machine_applies_undoes_and_rests():
    model = tiny_model("bert", seed=1)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    calls = []

    def metric(m, sites):
        calls.append(len(sites))
        return torch.arange(8.0).view(2, 4)

    cb = DynamicSwap(model, DynamicSwapConfig(rule="hard", start=2, frequency=2, rest=1, max_switches=1),
                     metric=metric)
    for finished in range(1, 7):  # rounds about to start: 2..7
        cb.end_of_round(finished)
    assert [(c, what) for c, what, _ in cb.history] == [(2, "apply"), (4, "undo"), (5, "apply"), (7, "undo")]
    assert [str(s) for s in cb.history[0][2]] == ["enc-self.1:3 <-> enc-self.0:0"]
    assert calls == [2, 2]
    assert all(torch.equal(v, original[k]) for k, v in model.state_dict().items())
    with pytest.raises(HeadwiseError, match="tokenizer= and texts="):
        DynamicSwap(model, DynamicSwapConfig())


def test_head_distances_follow_a_permutation_alpha():
    model = tiny_model("bert")
    add_mixers(model)
    perm = torch.tensor([2, 0, 3, 1])
    with torch.no_grad():
        for m in (m for _, m in mixers_of(model)):
            m.alpha.copy_(torch.eye(4)[perm])  # Z'_i = Z_perm[i]
    from headwise.mixing.distances import head_distances

    class Tok:
        pad_token_id, model_max_length = 0, 64

        def __call__(self, texts, truncation, max_length, return_special_tokens_mask):
            ids = [[2 + (ord(c) % 90) for c in t] for t in texts]
            return {"input_ids": ids, "special_tokens_mask": [[0] * len(x) for x in ids]}

    doc = head_distances(model, Tok(), ["hello world", "mixing heads", "abc"], batch_size=2)
    site = doc["sites"]["enc-self.0"]
    for metric in ("cosine", "l2"):
        before, after = torch.tensor(site["before"][metric]), torch.tensor(site["after"][metric])
        torch.testing.assert_close(after, before[perm][:, perm])
    z = torch.randn(2, 3, 4, 5)
    cos, l2 = pairwise(z, torch.ones(2, 3, dtype=torch.bool))
    a, b = z[0, :, 0].flatten(), z[0, :, 2].flatten()
    torch.testing.assert_close(cos[0, 0, 2].float(), torch.nn.functional.cosine_similarity(a, b, dim=0))
    torch.testing.assert_close(l2[0, 0, 2].float(), (a - b).norm())
    assert set(alpha_table(model)) == {"enc-self.0", "enc-self.1"}
