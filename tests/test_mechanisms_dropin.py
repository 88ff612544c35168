"""Mechanisms inside transformers models: through the runtime, with the model's own q/k/v/o, saved and reloaded."""

import pytest
import torch
from mechanism_cases import CAUSAL_CASES, case_id
from tiny import CAUSAL, FAMILIES, tiny_inputs, tiny_model

import headwise
from headwise.compat import CACHE
from headwise.errors import HeadwiseError
from headwise.mechanisms import apply, mechanisms_of, remove


def _hidden(model, inputs):
    with torch.no_grad():
        return model(**inputs).last_hidden_state


@pytest.mark.parametrize("family", FAMILIES)
def test_a_window_covering_the_input_reproduces_the_model(family):
    model = tiny_model(family)
    inputs, real = tiny_inputs(family)
    ref = _hidden(model, inputs)
    name, args = ("local2d", {"window": 4, "prefix_tokens": 1}) if family == "vit" else ("eva", {"window": 64})
    apply(model, name, **args)
    torch.testing.assert_close(_hidden(model, inputs)[real], ref[real], atol=1e-5, rtol=0)
    apply(model, "local", replace=True, window=1)  # a real change: each token sees only itself
    assert (_hidden(model, inputs)[real] - ref[real]).abs().max() > 1e-3
    remove(model)
    torch.testing.assert_close(_hidden(model, inputs)[real], ref[real], atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["bert", "llama", "gpt2"])
@pytest.mark.parametrize("name", ["performer", "eva", "linear", "scatterbrain"])
def test_padding_never_changes_real_outputs_inside_models(family, name):
    model = tiny_model(family)
    args = {"eva": {"window": 2, "chunk_size": 1 if family in CAUSAL else 2}, "scatterbrain": {"window": 2},
            "performer": {"features": 8}}.get(name, {})
    apply(model, name, **args)
    inputs, real = tiny_inputs(family)
    ref = _hidden(model, inputs)
    inputs["input_ids"] = inputs["input_ids"].masked_fill(~real, 5)
    torch.testing.assert_close(_hidden(model, inputs)[real], ref[real], atol=1e-5, rtol=0)


def test_non_causal_mechanisms_are_refused_on_decoders():
    with pytest.raises(HeadwiseError, match="'nystrom' cannot be causal"):
        apply(tiny_model("gpt2"), "nystrom")


def test_sliding_window_masks_are_refused():
    import transformers as tf

    cfg = tf.MistralConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                           intermediate_size=37, vocab_size=97, sliding_window=3)
    model = tf.AutoModel.from_config(cfg, attn_implementation="sdpa").eval()
    apply(model, "linear")
    with pytest.raises(HeadwiseError, match="more than key padding"):
        model(input_ids=torch.randint(2, 97, (1, 9)))


@pytest.mark.parametrize("case", [c for c in CAUSAL_CASES if c[0] != "eva" and (c[0] != "eva-paper" or
                                                                          c[1].get("adaptive") == "none")]
                         + [("eva", {"window": 4, "chunk_size": 2, "proposal": "key"}),
                            ("eva", {"window": 4, "chunk_size": 2, "proposal": "uniform"})], ids=case_id)
def test_cached_generation_matches_the_full_forward(case):
    name, args = case
    torch.manual_seed(0)
    model = tiny_model("llama")
    apply(model, name, **args)
    model.eval()
    ids = torch.randint(2, 97, (1, 13))
    with torch.no_grad():
        full = model(input_ids=ids).last_hidden_state
        past = model(input_ids=ids[:, :6], use_cache=True)[CACHE]
        step = model(input_ids=ids[:, 6:9], **{CACHE: past}, use_cache=True)
        last = model(input_ids=ids[:, 9:], **{CACHE: step[CACHE]}, use_cache=True).last_hidden_state
    torch.testing.assert_close(torch.cat([step.last_hidden_state, last], 1), full[:, 6:], atol=1e-5, rtol=1e-4)


def test_cached_generation_refuses_query_summaries():
    model = tiny_model("llama")
    apply(model, "eva", window=4, chunk_size=2, proposal="query")
    ids = torch.randint(2, 97, (1, 9))
    with torch.no_grad():
        past = model(input_ids=ids[:, :6], use_cache=True)[CACHE]
        with pytest.raises(HeadwiseError, match="summarises past queries.*proposal='key'"):
            model(input_ids=ids[:, 6:], **{CACHE: past}, use_cache=True)


def test_mechanism_parameters_train_save_and_reload(tmp_path):
    model = tiny_model("bert")
    ops = apply(model, "local", window=2, rel_pos_bias=True)
    assert all(any(p is op.core.bias for p in model.parameters()) for op in ops.values())
    inputs, real = tiny_inputs("bert")
    model.train()
    model(**inputs).last_hidden_state[real].pow(2).sum().backward()
    assert all(op.core.bias.grad is not None and op.core.bias.grad.abs().sum() > 0 for op in ops.values())
    model.eval()
    with torch.no_grad():
        for op in ops.values():
            op.core.bias.normal_()
    headwise.save_pretrained(model, tmp_path / "local")
    again = headwise.from_pretrained(tmp_path / "local")
    assert set(mechanisms_of(again)) == set(ops)
    torch.testing.assert_close(_hidden(again, inputs), _hidden(model, inputs), atol=0, rtol=0)


def test_random_features_reload_exactly(tmp_path):
    model = tiny_model("gpt2")
    apply(model, "performer", features=8, seed=3, redraw="every_step")
    model.train()
    model(**tiny_inputs("gpt2")[0])  # redraws: the saved features are no longer the seed's first draw
    model.eval()
    headwise.save_pretrained(model, tmp_path / "perf")
    again = headwise.from_pretrained(tmp_path / "perf")
    inputs, _ = tiny_inputs("gpt2")
    torch.testing.assert_close(_hidden(again, inputs), _hidden(model, inputs), atol=0, rtol=0)
