import pytest
import torch
import transformers as tf
from tiny import CAUSAL, FAMILIES, VOCAB, tiny_inputs, tiny_model

from headwise.runtime import HeadGate, add_gates, add_observer, detach, enable
from headwise.sites import Selection, find_sites


def _hidden(model, inputs, **kw):
    return model(**inputs, **kw).last_hidden_state


@pytest.mark.parametrize("family", FAMILIES)
def test_headwise_matches_eager_at_real_tokens(family):
    eager, ours = tiny_model(family, "eager"), tiny_model(family, "headwise")
    inputs, real = tiny_inputs(family)
    with torch.no_grad():
        ref = _hidden(eager, inputs)
        torch.testing.assert_close(_hidden(ours, inputs)[real], ref[real], atol=1e-5, rtol=0)
        add_gates(ours)  # all ones: nothing changes
        torch.testing.assert_close(_hidden(ours, inputs)[real], ref[real], atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_explicit_softmax_path_and_output_attentions_match_eager(family):
    eager, ours = tiny_model(family, "eager"), tiny_model(family, "headwise")
    inputs, real = tiny_inputs(family)
    seen = []
    for site in find_sites(ours):
        add_observer(site, "probe", lambda probs, keep, out: seen.append(probs.shape))
    with torch.no_grad():
        ref = eager(**inputs, output_attentions=True)
        got = ours(**inputs, output_attentions=True)
    assert len(seen) == ours.config.num_hidden_layers if family != "distilbert" else ours.config.n_layers
    torch.testing.assert_close(got.last_hidden_state[real], ref.last_hidden_state[real], atol=1e-5, rtol=0)
    assert len(got.attentions) == len(ref.attentions) > 0
    for a, b in zip(got.attentions, ref.attentions):
        # rows of padded queries are undefined; compare the rows of real queries
        torch.testing.assert_close(a.transpose(1, 2)[real], b.transpose(1, 2)[real], atol=1e-6, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_zero_gate_equals_zeroing_the_head_slice_of_the_output_projection(family):
    head = 1
    gated, manual = tiny_model(family, "headwise"), tiny_model(family, "eager")
    inputs, real = tiny_inputs(family)
    gates = add_gates(gated)
    site = find_sites(gated)[-1]
    with torch.no_grad():
        gates[site.path].weight[head] = 0.0
    d = site.head_dim
    o_module = find_sites(manual)[-1].o.module

    def zero_slice(module, args):  # a shared module (ALBERT) runs once per layer: the gate acts every time
        x = args[0].clone()
        x[..., head * d : (head + 1) * d] = 0
        return (x,)

    o_module.register_forward_pre_hook(zero_slice)
    with torch.no_grad():
        got, ref = _hidden(gated, inputs), _hidden(manual, inputs)
        plain = _hidden(tiny_model(family, "eager"), inputs)
    torch.testing.assert_close(got[real], ref[real], atol=1e-5, rtol=0)
    assert (got[real] - plain[real]).abs().max() > 1e-3  # the gate really did something


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama", "vit"])
def test_gradients_reach_every_gate(family):
    model = tiny_model(family, "headwise")
    inputs, _ = tiny_inputs(family)
    gates = add_gates(model)
    _hidden(model, inputs).pow(2).sum().backward()
    for gate in gates.values():
        assert gate.weight.grad is not None and torch.all(gate.weight.grad != 0)


def test_gqa_gates_act_per_query_head():
    """With 4 query heads over 2 kv heads, zeroing query head 1 leaves head 0 (same kv group) untouched."""
    model = tiny_model("llama", "headwise")
    site = find_sites(model)[0]
    gate = add_gates(model, selection=Selection(names=[site.name]))[site.path]
    captured = {}
    model.layers[0].self_attn.o_proj.register_forward_pre_hook(lambda m, a: captured.__setitem__("z", a[0].clone()))
    inputs, _ = tiny_inputs("llama")
    with torch.no_grad():
        model(**inputs)
        before = captured["z"].unflatten(-1, (4, 8))
        gate.weight[1] = 0
        model(**inputs)
        after = captured["z"].unflatten(-1, (4, 8))
    assert torch.all(after[:, :, 1] == 0)
    torch.testing.assert_close(after[:, :, 0], before[:, :, 0])


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_greedy_generation_with_cache_unchanged_by_unit_gates(family):
    torch.manual_seed(0)
    cls = {"gpt2": tf.GPT2LMHeadModel, "llama": tf.LlamaForCausalLM}[family]
    config = tiny_model(family).config
    eager = cls(config).eval()
    eager.set_attn_implementation("eager")
    ours = cls(config).eval()
    ours.load_state_dict(eager.state_dict())
    enable(ours)
    add_gates(ours)
    prompt = torch.randint(2, VOCAB, (2, 4))
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(eager.generate(prompt, **kw), ours.generate(prompt, **kw))


def test_detach_removes_the_container_when_empty():
    model = tiny_model("bert")
    site = find_sites(model)[0]
    add_gates(model, selection=Selection(names=[site.name]))
    assert hasattr(site.module, "headwise")
    detach(site, "gate")
    assert not hasattr(site.module, "headwise")


def test_gate_spec_round_trips():
    gate = HeadGate(6)
    assert HeadGate(**gate.spec()).weight.shape == (6,)


def test_causal_families_flagged():
    assert {f for f in FAMILIES if find_sites(tiny_model(f))[0].causal} == CAUSAL


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_cpu_sdpa_reads_grouped_keys_under_a_mask_as_the_repeated_keys_do(mask_kind, dtype):
    """On a CPU, a GQA call under a mask runs PyTorch's SDPA over the grouped keys (``enable_gqa``) instead of
    transformers' repeated keys: the same output as transformers' path (its keys repeated to every query head) and as
    an explicit softmax in float32, for chunk-shaped calls (4 queries, the last of 9 keys) with left padding."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from headwise.runtime.attention import sdpa

    gen = torch.Generator().manual_seed(3)
    B, H, Hkv, n, T, d = 2, 6, 2, 4, 9, 8
    query, key, value = (torch.randn(B, h, t, d, generator=gen).to(dtype) for h, t in ((H, n), (Hkv, T), (Hkv, T)))
    keep = (torch.arange(T - n, T)[:, None] >= torch.arange(T))[None, None].repeat(B, 1, 1, 1)
    keep[1, ..., :3] = False  # left padding of the second sentence
    additive = torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)
    mask = keep if mask_kind == "bool" else additive
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal, module.training = H // Hkv, True, False
    ours = sdpa(module, query, key, value, mask, 0.0, d ** -0.5, True)
    theirs, _ = sdpa_attention_forward(module, query, key, value, mask, dropout=0.0, scaling=d ** -0.5, is_causal=True)
    scores = (query.float() @ key.float().repeat_interleave(H // Hkv, 1).transpose(-1, -2)) * d ** -0.5
    reference = (scores.masked_fill(~keep, float("-inf")).softmax(-1) @ value.float().repeat_interleave(H // Hkv, 1))
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(ours, theirs, **tol)
    torch.testing.assert_close(ours.float(), reference.transpose(1, 2), **tol)
