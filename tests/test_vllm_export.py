"""``headwise.clients.vllm.export_vllm``: the folder vLLM serves for a model with a KV policy (docs/serving.md).
Checked here without vLLM: what the config says and that the weights are the model's; vLLM serving the folders is
``make test-vllm`` (tests_vllm/)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from headwise.clients.vllm import FORMAT, POLICY_KEY, export_vllm
from headwise.errors import HeadwiseError
from headwise.kvcache import FULL, KVPolicy, apply_kv_policy, policy_of, streaming
from headwise.kvcache.generation import sink_logits_of

import transformers as tf
from tiny import tiny_model


def causal(family: str) -> torch.nn.Module:
    """A tiny random decoder of ``family`` with its language-model head."""
    torch.manual_seed(0)
    return tf.AutoModelForCausalLM.from_config(tiny_model(family).config, attn_implementation="headwise").eval()


def test_per_head_policy_names_the_plugin_and_carries_vllm_windows(tmp_path):
    model = causal("llama")  # 2 layers x 2 KV heads
    policy = KVPolicy(((FULL, streaming(4, 7)), (streaming(4, 7, context=64), FULL)))
    apply_kv_policy(model, policy)
    exported = export_vllm(model, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert exported.served == "plugin" and config["architectures"] == ["HeadwiseLlamaForCausalLM"]
    # vLLM's window counts the query itself: headwise's 7 previous tokens are 8 there; a scaled window at its cap
    assert config[POLICY_KEY] == {"format": FORMAT, "version": 2, "sliding_window": [[None, 8], [8, None]],
                                  "sink_logit": None, "dropped_sink": 4}
    assert "4 sink tokens" in exported.describe()
    assert policy_of(model) == policy  # the model keeps its policy
    # the weights are the model's: plain transformers loads the folder (as the base model, full cache)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    ids = torch.tensor([[3, 5, 7, 11, 13]])
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, model(ids).logits)


def test_whole_layer_policy_is_native_layer_types(tmp_path):
    model = causal("mistral")
    apply_kv_policy(model, KVPolicy(((streaming(0, 5), streaming(0, 5)), (FULL, FULL))))
    exported = export_vllm(model, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert exported.served == "native" and exported.dropped_sink == 0
    assert config["layer_types"] == ["sliding_attention", "full_attention"] and config["sliding_window"] == 6
    assert POLICY_KEY not in config and config["architectures"] == ["MistralForCausalLM"]


def test_sink_logits_are_written_per_streaming_query_head(tmp_path):
    """A policy applied with sink logits exports them for each streaming KV head's query heads (full heads: null),
    through the plugin even for whole layers (vLLM's own classes take no sinks), and the model keeps them."""
    model = causal("mistral")  # 2 layers x 2 KV heads x 2 query heads each
    logits = torch.tensor([[[0.5, 1.5], [2.5, 3.5]], [[4.5, 5.5], [6.5, 7.5]]])
    apply_kv_policy(model, KVPolicy(((streaming(0, 5), streaming(0, 5)), (FULL, FULL))), sink_logits=logits)
    exported = export_vllm(model, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert exported.served == "plugin" and exported.sink_logit and "sink logits" in exported.describe()
    assert config[POLICY_KEY]["sink_logit"] == [[[0.5, 1.5], [2.5, 3.5]], [None, None]]
    assert config[POLICY_KEY]["sliding_window"] == [[6, 6], [None, None]]
    assert torch.equal(sink_logits_of(model), logits)


def test_qwen2_whole_layer_policy_goes_through_the_plugin(tmp_path):
    """vLLM's Qwen2 has no per-layer windows: even a whole-layer policy needs the plugin there."""
    model = causal("qwen2")  # 1 KV head per layer
    apply_kv_policy(model, KVPolicy(((streaming(0, 5),), (FULL,))))
    assert export_vllm(model, tmp_path / "out").served == "plugin"


def test_refuses_a_model_without_policy(tmp_path):
    with pytest.raises(HeadwiseError, match="has no KV policy"):
        export_vllm(causal("llama"), tmp_path / "out")
    assert not (tmp_path / "out").exists()
