"""KV gates trained through the shared Trainer: one update equals a plain Adam loop written here (the reference),
the model is left as it was, and two processes end with the same ``α``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from headwise.kvcache import KVGateConfig, add_kv_gates, remove_kv_gates
from headwise.kvcache.gates import kv_gates
from headwise.kvcache.learn import gate_prompts
from headwise.training import train_kv_gates
from test_kvcache_scores import char_tokenizer, tiny_lm
from two_processes import torchrun_two


def reference_alpha(model, tokenizer, config: KVGateConfig) -> torch.Tensor:
    """The objective by hand: Adam on α only, loss = mean squared difference of the last hidden states with and
    without the gates (α = 1 everywhere) on the prompt's region + l1 · mean(α), then α clipped to [0, 1]."""
    for p in model.parameters():
        p.requires_grad_(False)
    prompts = gate_prompts(tokenizer, config)
    gates = add_kv_gates(model, config.sink, config.window, config.init)
    optimizer = torch.optim.Adam([g.alpha for g in gates], lr=config.lr)
    for _ in range(config.steps):
        ids, region = next(prompts)
        alpha = [g.alpha.detach().clone() for g in gates]
        with torch.no_grad():
            for g in gates:
                g.alpha.fill_(1.0)
            target = model.model(input_ids=ids[None], use_cache=False).last_hidden_state[:, region]
            for g, a in zip(gates, alpha):
                g.alpha.copy_(a)
        hidden = model.model(input_ids=ids[None], use_cache=False).last_hidden_state[:, region]
        loss = (hidden - target).pow(2).mean() + config.l1 * torch.cat([g.alpha for g in gates]).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            for g in gates:
                g.alpha.clamp_(0.0, 1.0)
    alpha = torch.stack([g.alpha.detach().clone() for g in gates])
    remove_kv_gates(model)
    return alpha


def test_one_update_equals_the_reference_loop():
    """With one prompt and one update both run Adam's first step on the same gradient; both clip to [0, 1]."""
    config = KVGateConfig(steps=1, lr=0.05, l1=0.5, length=160, sink=2, window=16, init=0.9)
    tok = char_tokenizer()
    model = tiny_lm()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trained = train_kv_gates(model, tok, config, progress=False, use_cpu=True)
    reference = reference_alpha(tiny_lm(), tok, config)
    assert trained.alpha.shape == reference.shape == (2, 2)
    torch.testing.assert_close(trained.alpha, reference, atol=1e-6, rtol=0)
    assert not torch.allclose(trained.alpha, torch.full_like(trained.alpha, 0.9))  # it moved
    assert trained.history and trained.history[-1]["mean_alpha"] == pytest.approx(trained.alpha.mean().item(),
                                                                                   abs=1e-6)
    assert not kv_gates(model) and all(p.requires_grad for p in model.parameters()) and not model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_several_updates_keep_alpha_in_range():
    learned = train_kv_gates(tiny_lm(), char_tokenizer(), KVGateConfig(steps=4, lr=0.5, l1=5.0, length=160, sink=2,
                                                                       window=16), progress=False, use_cpu=True)
    assert learned.alpha.min() >= 0 and learned.alpha.max() <= 1 and learned.alpha.min() < 1
    assert len(learned.history) == 4


@pytest.mark.slow
def test_two_processes_end_with_the_same_alpha(tmp_path):
    torchrun_two(Path(__file__).parent / "scripts" / "train_kv_gates_distributed.py", tmp_path, port=29541)
    a, b = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert torch.equal(a, b)
    assert not torch.allclose(a, torch.ones_like(a))  # the gates did train
