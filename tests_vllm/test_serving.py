"""headwise's edits served by vLLM's CPU build (``make test-vllm``; docs/serving.md).

pytest runs in headwise's environment, which computes every reference in transformers; each engine runs in vLLM's
own environment (``$HEADWISE_VLLM_PYTHON``, no headwise there) through ``engine.py``, one engine per folder, started
once per module (a start takes about a minute on two cores). float32 on both sides, greedy decoding.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import headwise
from headwise.clients.vllm import export_vllm
from headwise.conversion import convert_gqa
from headwise.io import export_plain
from headwise.kvcache import FULL, KVPolicy, apply_kv_policy, kv_policy, streaming
from headwise.kvcache.passkey import passkey_prompts

ENGINE = Path(__file__).with_name("engine.py")
KV_BYTES = 1 << 30  # every engine's KV cache: equal memory for the capacity comparison
CONTEXT = 8192  # tokens per request the engines are sized for (max_model_len)
CHUNK = 512  # tokens per prefill step (max_num_batched_tokens): a window layer holds its window plus one chunk
NEW = 12  # greedy tokens per prompt
ENGINE_ARGS = {"dtype": "float32", "kv_cache_memory_bytes": KV_BYTES, "max_model_len": CONTEXT,
               "max_num_batched_tokens": CHUNK, "enforce_eager": True, "seed": 0}


def serve(folder: Path, prompts: list[list[int]], tmp: Path, engine: dict | None = None, name: str = "",
          env: dict[str, str] | None = None) -> dict:
    """Start vLLM on ``folder`` in its environment (``engine``: LLM keywords, default ``ENGINE_ARGS``; ``env``:
    variables for vLLM), generate ``NEW`` greedy tokens (top-5 log-probabilities) for each prompt, and return
    engine.py's answer with vLLM's KV accounting (``name`` tells the job files of one folder's engines apart)."""
    python = os.environ.get("HEADWISE_VLLM_PYTHON")
    if not python:
        raise RuntimeError("HEADWISE_VLLM_PYTHON is not set: run these tests with `make test-vllm`, which builds "
                           "vLLM's environment and sets it")
    job, out = tmp / f"{folder.name}{name}-job.json", tmp / f"{folder.name}{name}-out.json"
    job.write_text(json.dumps({"model": str(folder), "engine": engine or ENGINE_ARGS, "env": env or {},
                               "prompts": prompts, "max_tokens": NEW, "logprobs": 5}))
    done = subprocess.run([python, str(ENGINE), str(job), str(out)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ""})
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-8000:])
        raise RuntimeError(f"vLLM failed on {folder} (exit {done.returncode}); its log is above")
    return json.loads(out.read_text())


@torch.no_grad()
def reference(model, prompts: list[list[int]]) -> tuple[list[list[int]], list[list[dict[int, float]]]]:
    """headwise's greedy tokens and each step's top-5 log-probabilities in transformers (``generate``: through
    the model's KV policy when it carries one)."""
    tokens, logprobs = [], []
    for ids in prompts:
        out = model.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=0)
        tokens.append(out.sequences[0, len(ids):].tolist())
        steps = []
        for logits in out.logits:
            top = torch.log_softmax(logits[0].float(), -1).topk(5)
            steps.append(dict(zip(top.indices.tolist(), top.values.tolist())))
        logprobs.append(steps)
    return tokens, logprobs


def same_tokens(vllm: list[list[int]], ours: list[list[int]]) -> bool:
    """Whether vLLM's tokens (``ignore_eos``: always ``NEW``) begin with headwise's, which end at the model's end
    of sequence or after ``NEW`` tokens."""
    return len(vllm) == len(ours) and all(v[:len(o)] == o for v, o in zip(vllm, ours))


def largest_gap(vllm: list[list[dict[str, float]]], ours: list[list[dict[int, float]]]) -> float:
    """The largest difference of a top-5 log-probability over the steps both have, every prompt (a token missing
    from the other's top 5 counts as infinite)."""
    gap = 0.0
    for steps_v, steps_o in zip(vllm, ours, strict=True):
        for v, o in zip(steps_v, steps_o):
            for token, value in o.items():
                gap = max(gap, abs(v[str(token)] - value) if str(token) in v else float("inf"))
    return gap


@pytest.fixture(scope="module")
def smol():
    model, tokenizer = headwise.load_model("smollm2-135m", task="lm", dtype="float32")
    return model, tokenizer


@pytest.fixture(scope="module")
def prompts(smol) -> list[list[int]]:
    """Three passkey prompts of about 1,400 tokens: longer than the policy's window, so streaming heads drop
    tokens."""
    _, tokenizer = smol
    return [p.ids.tolist() for p in passkey_prompts(tokenizer, 1400, [0.1, 0.5, 0.9], 1, seed=69)]


@pytest.fixture(scope="module")
def folders(tmp_path_factory, smol):
    """The unedited model's plain folder, and the model under the 0.5 policy sized for 8k tokens (fixed windows,
    no sinks: what vLLM computes exactly) exported for vLLM."""
    model, tokenizer = smol
    root = tmp_path_factory.mktemp("served")
    export_plain(model, root / "full", tokenizer=tokenizer)
    policy, _ = kv_policy(model, tokenizer, kv_budget=0.5, context=CONTEXT, sink=0, ranking="random",
                          scaled=False, progress=False)
    apply_kv_policy(model, policy)
    exported = export_vllm(model, root / "policy", tokenizer=tokenizer)
    return root, policy, exported


@pytest.fixture(scope="module")
def served(folders, prompts, smol, tmp_path_factory):
    """vLLM's answers on the full folder and the policy folder, and headwise's on the same prompts (the model
    carries the policy: ``generate`` goes through it; the full reference is taken with it removed)."""
    root, policy, exported = folders
    model, _ = smol
    tmp = tmp_path_factory.mktemp("engines")
    with_policy = reference(model, prompts)
    headwise.remove_kv_policy(model)
    full = reference(model, prompts)
    apply_kv_policy(model, policy)
    return {"policy": serve(root / "policy", prompts, tmp), "full": serve(root / "full", prompts, tmp),
            "headwise_policy": with_policy, "headwise_full": full, "export": exported}


def test_policy_folder_is_served_by_the_plugin(served):
    assert served["export"].served == "plugin" and served["export"].dropped_sink == 0
    assert served["policy"]["architecture"] == "HeadwiseLlamaForCausalLM"
    kinds = {kind for kind, _, _ in served["policy"]["groups"]}
    assert kinds <= {"FullAttentionSpec", "SlidingWindowSpec"} and "SlidingWindowSpec" in kinds


def test_plugin_gives_headwise_policy_tokens(served):
    """Greedy tokens and top-5 log-probabilities of vLLM with the plugin equal headwise's policy in transformers;
    the policy changes the log-probabilities by far more than vLLM differs from headwise (it acts)."""
    tokens, logprobs = served["headwise_policy"]
    assert same_tokens(served["policy"]["tokens"], tokens)
    gap = largest_gap(served["policy"]["logprobs"], logprobs)
    print(f"plugin: largest log-prob gap {gap:.2e}")
    assert gap < 2e-3
    policy_effect = largest_gap([[{str(t): v for t, v in s.items()} for s in p] for p in logprobs],
                                served["headwise_full"][1])
    print(f"policy vs full in headwise: largest log-prob gap {policy_effect:.2e}")
    assert policy_effect > 10 * max(gap, 1e-4)


def test_full_folder_gives_headwise_tokens(served):
    tokens, logprobs = served["headwise_full"]
    assert same_tokens(served["full"]["tokens"], tokens)
    print(f"full: largest log-prob gap {largest_gap(served['full']['logprobs'], logprobs):.2e}")
    assert largest_gap(served["full"]["logprobs"], logprobs) < 2e-3


def test_engine_counts_policy_capacity(served, folders):
    """vLLM's own KV accounting at equal KV memory, 8k-token requests and 512-token chunks: the 0.5 policy fits
    at least 1.8x the full model's concurrent requests (the ideal is 2x; a window also holds one chunk), and the
    full model's capacity is its bytes per token (2 · 30 layers · 3 KV heads · 64 · 4 bytes)."""
    _, policy, _ = folders
    full, ours = served["full"], served["policy"]
    per_token = 2 * 30 * 3 * 64 * 4
    assert abs(full["kv_cache_tokens"] - KV_BYTES // per_token) <= CONTEXT  # vLLM rounds to whole blocks
    ratio = ours["max_concurrency"] / full["max_concurrency"]
    print(f"capacity: full {full['kv_cache_tokens']} tokens {full['max_concurrency']:.2f}x, policy "
          f"{ours['kv_cache_tokens']} tokens {ours['max_concurrency']:.2f}x ({ratio:.3f}), groups {ours['groups']}")
    assert len(policy.full_heads()) == 38
    assert ratio >= 1.8, (ours, full)
    assert ours["kv_cache_tokens"] > 1.8 * full["kv_cache_tokens"]


@pytest.fixture(scope="module")
def gqa(smol, prompts, tmp_path_factory):
    """SmolLM2 converted to one KV head per layer (``convert_gqa``), its plain folder served natively by vLLM,
    and headwise's greedy tokens of the converted model."""
    model, tokenizer = headwise.load_model("smollm2-135m", task="lm", dtype="float32")
    convert_gqa(model, kv_heads=1, init="svd")
    root = tmp_path_factory.mktemp("gqa")
    export_plain(model, root / "gqa", tokenizer=tokenizer)
    return serve(root / "gqa", prompts, root), reference(model, prompts)


def test_plain_gqa_folder_served_natively(gqa):
    served, (tokens, logprobs) = gqa
    assert served["architecture"] == "LlamaForCausalLM"
    gap = largest_gap(served["logprobs"], logprobs)
    print(f"gqa: {served['kv_cache_tokens']} tokens, largest log-prob gap {gap:.2e}")
    assert same_tokens(served["tokens"], tokens)
    # float32 rounding differs between vLLM's fused projections and transformers'; the converted model's
    # flatter distributions show more of it (5.5e-3 measured, against 5e-5 on the unedited model)
    assert gap < 1e-2
    # one KV head per layer: a third of the full model's bytes per token, so three times its tokens
    assert abs(served["kv_cache_tokens"] - KV_BYTES // (2 * 30 * 1 * 64 * 4)) <= CONTEXT


@pytest.fixture(scope="module")
def whole_layers(smol, prompts, tmp_path_factory):
    """SmolLM2 with every odd layer a 255-token window (no sinks), exported natively (``layer_types``), served by
    vLLM without the plugin, and headwise's greedy tokens under the same policy."""
    model, tokenizer = headwise.load_model("smollm2-135m", task="lm", dtype="float32")
    policy = KVPolicy(tuple((streaming(0, 255),) * 3 if layer % 2 else (FULL,) * 3 for layer in range(30)))
    apply_kv_policy(model, policy)
    root = tmp_path_factory.mktemp("layers")
    exported = export_vllm(model, root / "layers", tokenizer=tokenizer)
    return exported, serve(root / "layers", prompts, root), reference(model, prompts)


def test_whole_layer_policy_served_natively(whole_layers):
    exported, ours, (tokens, logprobs) = whole_layers
    assert exported.served == "native" and ours["architecture"] == "LlamaForCausalLM"
    assert {kind for kind, _, _ in ours["groups"]} == {"FullAttentionSpec", "SlidingWindowSpec"}
    assert same_tokens(ours["tokens"], tokens)
    assert largest_gap(ours["logprobs"], logprobs) < 2e-3
    print(f"whole layers (native): {ours['kv_cache_tokens']} tokens, {ours['max_concurrency']:.2f}x, largest "
          f"log-prob gap {largest_gap(ours['logprobs'], logprobs):.2e}")
    # half the layers hold a window: well above the full model's tokens (its bytes per token, as above)
    assert ours["kv_cache_tokens"] > 1.5 * KV_BYTES // (2 * 30 * 3 * 64 * 4)
