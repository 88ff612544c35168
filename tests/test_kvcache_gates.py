"""DuoAttention-style KV gates: α = 1 is the model, α = 0 the masked sink + window reference, mixes against an eager
reference, gradients reach α only, learning moves α, ``kv_policy(ranking="learned")`` and ``--scores learned``."""

from __future__ import annotations

import json

import pytest
import torch

import headwise
from headwise import HeadwiseError
from headwise.cli import main
from headwise.kvcache import (KVGate, KVGateConfig, KVPolicy, add_kv_gates, full_heads_for_budget, kv_gate_values,
                              kv_policy, rank_kv_heads, remove_kv_gates, streaming)
from headwise.kvcache.gates import kv_gates
from headwise.kvcache.learn import gate_prompts
from headwise.training import train_kv_gates
from headwise.training.kv_gates import GateDistillation
from test_kvcache import causal_lm, prompt, reference_logits
from test_kvcache_scores import char_tokenizer, saved_lm_and_text, tiny_lm
from tiny import tiny_model

FAMILIES = ["llama", "qwen2", "gpt2"]
SINK, WINDOW = 1, 3
GATES = KVGateConfig(steps=6, lr=0.05, length=160, sink=2, window=16)


def positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)  # as reference_logits numbers left-padded rows


@pytest.mark.parametrize("family", FAMILIES)
def test_alpha_one_is_the_model_and_alpha_zero_the_streaming_reference(family):
    model, inputs = causal_lm(family), prompt()
    real = inputs["attention_mask"].bool()
    pos = positions(inputs["attention_mask"])
    with torch.no_grad():
        plain = model(**inputs, position_ids=pos).logits
    gates = add_kv_gates(model, SINK, WINDOW)
    assert len(gates) == model.config.num_hidden_layers and kv_gate_values(model).eq(1).all()
    with torch.no_grad():
        assert torch.equal(model(**inputs, position_ids=pos).logits[real], plain[real])
        for g in gates:
            g.alpha.zero_()
        streamed = model(**inputs, position_ids=pos).logits
    reference = reference_logits(model, KVPolicy.uniform(model, streaming(SINK, WINDOW)), inputs["input_ids"],
                                 inputs["attention_mask"])
    torch.testing.assert_close(streamed[real], reference[real], atol=1e-5, rtol=1e-5)
    assert (streamed[real] - plain[real]).abs().max() > 1e-2  # the window matters on this prompt
    remove_kv_gates(model)
    with torch.no_grad():
        assert torch.equal(model(**inputs, position_ids=pos).logits[real], plain[real])
    with pytest.raises(HeadwiseError, match="nothing to remove"):
        remove_kv_gates(model)  # never silent when there is nothing to take off


def eager_mix(q, k, v, keep, alpha, sink, window, scaling):
    """``α·softmax(full) + (1 − α)·softmax(sink + window)`` per query head, in float64, ``[B, T, Hq, d]``."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    t = q.shape[2]
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    causal = (j <= i) & keep
    pad = (~keep[:, 0, -1]).sum(-1)[:, None, None, None]  # left padding: sinks are a row's first real tokens
    stream = causal & ((j - pad < sink) | (i - j <= window))
    outs = []
    for allowed in (causal, stream):
        allowed = allowed | ~allowed.any(-1, keepdim=True)
        scores = (q @ k.transpose(-1, -2) * scaling).masked_fill(~allowed, float("-inf"))
        outs.append(scores.softmax(-1) @ v)
    a = alpha.double().repeat_interleave(group)[None, :, None, None]
    return (a * outs[0] + (1 - a) * outs[1]).transpose(1, 2)


def gate_inputs(dtype=torch.float32, device=None):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, 12, 8, generator=g) * 2 for h in (6, 2, 2))
    keep = torch.ones(2, 1, 12, 12, dtype=torch.bool)
    keep[1, ..., :3] = False  # row 1 left-padded by 3
    return [t.to(dtype=dtype, device=device) for t in (q, k, v)] + [keep.to(device)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_gate_mixes_full_and_streaming_per_kv_head(dtype):
    module = torch.nn.Linear(1, 1).eval()
    gate = KVGate(2, sink=2, window=4)
    with torch.no_grad():
        gate.alpha.copy_(torch.tensor([0.25, 0.9]))
    q, k, v, keep = gate_inputs(dtype)
    with torch.no_grad():
        out = gate(module, q, k, v, keep, 8 ** -0.5, 0.0, True)
    ref = eager_mix(q, k, v, keep, gate.alpha, 2, 4, 8 ** -0.5)
    assert out.dtype == dtype and out.shape == (2, 12, 6, 8)
    real = keep[:, 0].any(-1)  # queries with at least one visible key
    tol = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 3e-2}[dtype]
    torch.testing.assert_close(out.double()[real], ref[real], atol=tol * ref.abs().max().item(), rtol=0)


def test_half_precision_model_matches_float32():
    model, inputs = causal_lm("llama"), prompt()
    gates = add_kv_gates(model, SINK, WINDOW, init=0.4)
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        ref = model(**inputs).logits
        for dtype, tol in ((torch.float16, 2e-2), (torch.bfloat16, 8e-2)):
            model.to(dtype)
            half = model(**inputs).logits
            assert half.dtype == dtype and gates[0].alpha.dtype == dtype
            torch.testing.assert_close(half.float()[real], ref[real], atol=tol * ref.abs().max().item(), rtol=0)
            model.float()


def test_meta_device():
    model = causal_lm("qwen2", device="meta")
    gates = add_kv_gates(model, SINK, WINDOW, init=0.5)
    assert gates[0].alpha.device.type == "meta"
    ids = torch.zeros(2, 9, dtype=torch.long, device="meta")
    with torch.no_grad():
        out = model(ids).logits
    assert out.device.type == "meta" and out.shape == (2, 9, model.config.vocab_size)


def test_gradients_reach_alpha_only_and_learning_leaves_the_model_unchanged():
    model, tok = tiny_lm("llama"), char_tokenizer()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    weights = list(model.parameters())
    for p in weights:
        p.requires_grad_(False)
    gates = add_kv_gates(model, 2, 16, init=0.5)
    ids, region = next(gate_prompts(tok, GATES))
    distill = GateDistillation(model, gates)(ids[None], torch.tensor([region.start, region.stop]))["loss"]
    distill.backward()
    assert distill > 0 and all(g.alpha.grad is not None and g.alpha.grad.abs().min() > 0 for g in gates)
    assert all(p.grad is None for p in weights)
    remove_kv_gates(model)
    for p in weights:
        p.requires_grad_(True)
    train_kv_gates(model, tok, GATES, progress=False, use_cpu=True)
    assert all(p.requires_grad and p.grad is None for p in model.parameters())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert not kv_gates(model)  # the gates came off


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_learning_lowers_the_loss_and_moves_alpha(family):
    model, tok = tiny_lm(family), char_tokenizer()
    result = train_kv_gates(model, tok, GATES, progress=False, use_cpu=True)
    first, last = result.history[0], result.history[-1]
    assert first["loss"] == pytest.approx(GATES.l1)  # α = 1: the model itself, no distillation error
    assert last["loss"] < first["loss"] and result.alpha.max() < 1 and result.alpha.min() >= 0
    assert result.alpha.shape == (2, model.config.num_key_value_heads if family != "gpt2" else 4)
    again = train_kv_gates(model, tok, GATES, progress=False, use_cpu=True)
    assert torch.equal(again.alpha, result.alpha)  # deterministic with the seed
    # without the L1 term the distillation alone pulls half-open gates back towards full attention
    pulled = train_kv_gates(model, tok, KVGateConfig(steps=6, lr=0.05, l1=0.0, init=0.5, length=160, sink=2,
                                                     window=16, region="all"), progress=False, use_cpu=True)
    assert pulled.alpha.min() > 0.5 and pulled.history[-1]["loss"] < pulled.history[0]["loss"]


def test_text_haystack_prompts():
    tok = char_tokenizer()
    texts = ["Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 6]
    config = KVGateConfig(length=400, sink=2, window=16, haystack="text", region="answer", seed=3)
    ids, region = next(gate_prompts(tok, config, texts))
    assert len(ids) == 400 + 6 and "Lorem ipsum dolor" in tok.decode(ids) and "pass key" in tok.decode(ids)
    key = tok.decode(ids[region.start + 1: region.stop + 1])
    assert key.strip().isdigit() and len(key.strip()) == 5
    with pytest.raises(HeadwiseError, match="longer texts"):
        next(gate_prompts(tok, config, ["short"]))
    with pytest.raises(HeadwiseError, match="needs texts"):
        next(gate_prompts(tok, config))


def test_kv_policy_ranks_by_learned_gates():
    model, tok = tiny_lm("llama"), char_tokenizer()
    alpha = train_kv_gates(model, tok, GATES, progress=False, use_cpu=True).alpha
    learned = train_kv_gates(model, tok, GATES, progress=False, use_cpu=True).scores(model.config.num_attention_heads)
    policy, scores = kv_policy(model, tok, kv_budget=0.6, context=160, sink=2, window=16, ranking="learned",
                               scores=learned, progress=False)
    assert torch.equal(scores.kv("learned"), alpha)
    n_full = full_heads_for_budget(4, 0.6, 160, 2, 16)
    top = torch.argsort(alpha.flatten(), descending=True, stable=True)[:n_full].tolist()
    assert policy.full_heads() == sorted(divmod(i, 2) for i in top)
    assert rank_kv_heads(scores, "learned")[:n_full] == [divmod(i, 2) for i in top]
    with pytest.raises(HeadwiseError, match="rank by 'learned'"):
        rank_kv_heads(scores, "combined")
    with pytest.raises(HeadwiseError, match="needs the gates' scores"):
        kv_policy(model, tok, 0.6, 160, 2, 16, ranking="learned", progress=False)


@pytest.mark.parametrize("bad, match", [
    (dict(steps=0), "steps"), (dict(lr=0.0), "lr"), (dict(l1=-1.0), "l1"), (dict(region="needle"), "region"),
    (dict(haystack="book"), "haystack"), (dict(init=1.5), "init"), (dict(length=18), "length=18"),
    (dict(window=0), "window"),
])
def test_bad_gate_options_are_refused_and_change_nothing(bad, match):
    model, tok = tiny_lm("llama"), char_tokenizer()
    config = KVGateConfig(**{**dict(steps=2, length=160, sink=2, window=16), **bad})
    with pytest.raises(HeadwiseError, match=match):
        train_kv_gates(model, tok, config, progress=False, use_cpu=True)
    assert not kv_gates(model) and all(p.requires_grad for p in model.parameters())


def test_gates_refuse_encoders_busy_sites_and_saving(tmp_path):
    with pytest.raises(HeadwiseError, match="decoder-only"):
        add_kv_gates(tiny_model("bert"), SINK, WINDOW)
    model = causal_lm("llama")
    add_kv_gates(model, SINK, WINDOW)
    with pytest.raises(HeadwiseError, match="already runs a mechanism"):
        add_kv_gates(model, SINK, WINDOW)
    with pytest.raises(HeadwiseError, match="cannot be saved"):  # transient: never written with the model
        headwise.save_pretrained(model, tmp_path / "gated")
    assert not (tmp_path / "gated").exists()
    remove_kv_gates(model)
    with pytest.raises(HeadwiseError, match="no KV gates"):
        kv_gate_values(model)


def test_kv_policy_command_with_learned_scores(tmp_path, capsys):
    saved_lm_and_text(tmp_path)
    args = ["kv-policy", "--model", str(tmp_path / "lm"), "--kv-budget", "0.6", "--context", "160", "--sink", "2",
            "--window", "16", "--data", str(tmp_path / "calib.txt"), "--check", "passkey", "--eval-keys", "0",
            "--no-perplexity",
            "--scores", "learned", "--gate-steps", "4", "--gate-length", "160", "--out", str(tmp_path / "out")]
    assert main(args) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["ranking"] == "learned" and summary["gates"]["steps"] == 4
    alpha = torch.tensor(json.loads((tmp_path / "out" / "scores.json").read_text())["per_kv_head"]["learned"])
    top = torch.argsort(alpha.flatten(), descending=True, stable=True)[:2].tolist()
    assert sorted(summary["full_heads"]) == sorted([list(divmod(i, alpha.shape[1])) for i in top])
    assert "gate alpha" in (tmp_path / "out" / "report.html").read_text()
    assert main(args + ["--gate-haystack", "text", "--gate-steps", "1", "--force"]) == 0  # haystack: --data text
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["gates"]["haystack"] == "text"
    for extra, match in ((["--gate-steps", "0"], "steps"), (["--kv-ranking", "retrieval"], "drop --kv-ranking"),
                         (["--gate-length", "10"], "gate length")):
        assert main(args[:-1] + [str(tmp_path / "bad")] + extra) == 2
        assert match in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_a_training_argument_the_config_sets_raises():
    with pytest.raises(HeadwiseError, match=r"max_steps= \(KVGateConfig.steps\), seed= \(KVGateConfig.seed\) is "
                                            "set by the config"):
        train_kv_gates(tiny_model("llama"), None, GATES, max_steps=3, seed=1)
