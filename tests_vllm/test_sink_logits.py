"""A policy with sink logits (headwise.kvcache.sink_logit) served by the plugin as vLLM's attention sinks: the same
greedy tokens and top-5 log-probabilities as headwise's policy in transformers, in float32."""

from __future__ import annotations

import pytest

import headwise
from headwise.clients.vllm import export_vllm
from headwise.kvcache import apply_kv_policy, kv_policy, passkey_prompts
from headwise.kvcache.sink_logit import sink_logits
from test_serving import ENGINE_ARGS, largest_gap, reference, same_tokens, serve

CONTEXT = 2048


@pytest.fixture(scope="module")
def sinks(tmp_path_factory):
    """SmolLM2 under the 0.5 policy at 2k tokens without sink tokens (fixed windows), its streaming query heads
    given sink logits calibrated on two passkey prompts (seed 0), exported for vLLM; headwise's answers with and
    without the logits on three ~1,400-token passkey prompts (seed 69)."""
    model, tokenizer = headwise.load_model("smollm2-135m", task="lm", dtype="float32")
    policy, _ = kv_policy(model, tokenizer, kv_budget=0.5, context=CONTEXT, sink=0, ranking="random",
                          scaled=False, progress=False)
    window = next(rule.window for layer in policy.heads for rule in layer if not rule.full)
    calibration = [p.ids for p in passkey_prompts(tokenizer, 1024, [0.3, 0.7], 1, seed=0)]
    logits = sink_logits(model, calibration, 4, window)
    prompts = [p.ids.tolist() for p in passkey_prompts(tokenizer, 1400, [0.1, 0.5, 0.9], 1, seed=69)]
    apply_kv_policy(model, policy)
    without = reference(model, prompts)
    apply_kv_policy(model, policy, sink_logits=logits)
    ours = reference(model, prompts)
    root = tmp_path_factory.mktemp("sinks")
    exported = export_vllm(model, root / "policy", tokenizer=tokenizer)
    served = serve(root / "policy", prompts, root, ENGINE_ARGS | {"max_model_len": CONTEXT})
    return exported, served, ours, without


def test_plugin_sinks_give_headwise_sink_logit_tokens(sinks):
    exported, served, (tokens, logprobs), (_, plain) = sinks
    assert exported.served == "plugin" and exported.sink_logit
    assert same_tokens(served["tokens"], tokens)
    gap = largest_gap(served["logprobs"], logprobs)
    effect = largest_gap([[{str(t): v for t, v in s.items()} for s in p] for p in logprobs], plain)
    print(f"sink logits: vLLM vs headwise largest top-5 log-prob gap {gap:.2e}; the logits' own effect {effect:.2e}")
    assert gap < 2e-3
    assert effect > 10 * max(gap, 1e-4)  # the sinks act: vLLM applies them as headwise does
