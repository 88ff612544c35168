import pytest
import torch
from tiny import FAMILIES, tiny_inputs, tiny_model

import headwise
from headwise.runtime import add_gates
from headwise.sites import find_sites

GQA = {"llama": [2, 3], "mistral": [0, 1], "qwen2": None}  # whole key/value groups; qwen2 has a single group


def _plan(family, sites):
    heads = GQA.get(family, [1, 3])
    return {s.path: heads for s in sites if heads is not None} | ({sites[0].path: [0, 2]} if family not in GQA else {})


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "qwen2"])
def test_surgery_equals_masking_and_reloads(family, tmp_path):
    masked, pruned = tiny_model(family), tiny_model(family)
    sites = find_sites(pruned)
    plan = _plan(family, sites)
    gates = add_gates(masked)
    with torch.no_grad():
        for path, heads in plan.items():
            gates[path].weight[heads] = 0
    before = sum(p.numel() for p in pruned.parameters())
    headwise.prune_heads(pruned, plan)

    inputs, real = tiny_inputs(family)
    with torch.no_grad():
        expected = masked(**inputs).last_hidden_state
        got = pruned(**inputs).last_hidden_state
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=0)

    removed = 0
    for site in sites:
        heads = plan.get(site.path, [])
        kv = len({h // site.group_size for h in heads})
        bias = lambda p: p.bias is not None and p.bias.dim() == 2  # noqa: E731
        per_q = site.head_dim * site.hidden_size + (site.head_dim if bias(site.q) else 0)
        per_kv = site.head_dim * site.hidden_size + (site.head_dim if bias(site.k) else 0)
        removed += len(heads) * (per_q + site.head_dim * site.hidden_size) + 2 * kv * per_kv
    assert before - sum(p.numel() for p in pruned.parameters()) == removed
    new_sites = {s.path: s for s in find_sites(pruned)}
    for path, heads in plan.items():
        assert new_sites[path].num_heads == 4 - len(heads)

    headwise.save_pretrained(pruned, tmp_path / "pruned")
    reloaded = headwise.from_pretrained(tmp_path / "pruned")
    with torch.no_grad():
        assert torch.equal(reloaded(**inputs).last_hidden_state, got)


def test_gates_follow_surgery_and_save(tmp_path):
    model = tiny_model("bert")
    gates = add_gates(model)
    site = find_sites(model)[0]
    with torch.no_grad():
        gates[site.path].weight.copy_(torch.tensor([0.5, 0.0, 2.0, 0.0]))
    inputs, real = tiny_inputs("bert")
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
    headwise.prune_heads(model, {"enc-self.0": [1, 3]})
    gate = headwise.runtime.gates_of(model)[site.path]
    assert gate.weight.tolist() == [0.5, 2.0]
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).last_hidden_state[real], expected[real], atol=1e-5, rtol=0)
    headwise.save_pretrained(model, tmp_path / "m")
    with torch.no_grad():
        assert torch.equal(headwise.from_pretrained(tmp_path / "m")(**inputs).last_hidden_state,
                           model(**inputs).last_hidden_state)


def test_successive_prunings_replay_in_order(tmp_path):
    model = tiny_model("gpt2")
    headwise.prune_heads(model, {"dec-self.0": [0]})
    headwise.prune_heads(model, {"dec-self.0": [2], "dec-self.1": [1, 2]})  # indices of the current heads
    assert [s.num_heads for s in find_sites(model)] == [2, 2]
    headwise.save_pretrained(model, tmp_path / "m")
    ids = torch.randint(2, 90, (2, 5))
    with torch.no_grad():
        assert torch.equal(headwise.from_pretrained(tmp_path / "m")(ids).last_hidden_state, model(ids).last_hidden_state)


@pytest.mark.parametrize(
    "family,plan,message",
    [
        ("bert", {"enc-self.0": [4]}, "out of range"),
        ("bert", {"enc-self.0": [0, 1, 2, 3]}, "allow_empty_layers"),
        ("bert", {"enc-self.9": [0]}, "no attention site"),
        ("bert", {"enc-self.0": [1, 1]}, "repeats"),
        ("llama", {"dec-self.0": [1]}, "grouped-query"),
    ],
)
def test_bad_requests_leave_the_model_untouched(family, plan, message):
    model = tiny_model(family)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(headwise.HeadwiseError, match=message):
        headwise.prune_heads(model, {"enc-self.1": [0], **plan} if family == "bert" else plan)
    after = model.state_dict()
    assert set(after) == set(state) and all(torch.equal(after[k], state[k]) for k in state)
    assert "headwise" not in model.config.to_dict() or not model.config.headwise.get("journal")
