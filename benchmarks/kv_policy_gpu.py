"""The per-head KV cache where users run LLMs: one GPU, a random-initialised model with Llama-3-8B's shapes (32
layers, 32 query / 8 KV heads, head dim 128, bf16), greedy ``generate()`` of ``--new`` tokens on seeded random ids,
every arm in one process, each warmed up with a full-length call before its timed call.

Arms (``ARMS``): the plain model (SDPA) with transformers' dynamic cache; the plain model with its static cache and
``torch.compile`` (``cache_implementation="static"`` + a ``CompileConfig``: CUDA graphs); the headwise attention
with a full cache (every head full); the policy at half the KV bytes, eager (dynamic cache, ``prefill_chunk``
"auto"); the policy compiled (``cache_implementation="static"``, the same compile config). The policy is
``headwise.kv_policy(model, None, kv_budget=0.5, context=C, ranking="random")`` (random weights carry no retrieval
signal). Compiled arms run on the rows named by ``--compiled-rows`` (each compiles once per row: minutes on a GPU).

Rows: 8k, 32k and 64k at batch 1; 8k at batch 8. Then throughput at equal memory: the largest batch of
``--equal-context``-token prompts whose KV bytes fit ``--kv-budget-gib`` (the full cache's and the policy's own,
``KVPolicy.kv_bytes``), and the decode tokens/s of the eager arms at that batch.

Per arm: prefill seconds (until the first token's logits, synchronised), decode tokens/s over the batch, peak
``torch.cuda.max_memory_allocated`` above the weights, KV bytes held at the end. Ratios: the policy against the best
full-cache arm of its regime (eager: plain dynamic or headwise full, whichever is faster; compiled: plain static).

    python benchmarks/kv_policy_gpu.py                       # on a GPU: ≤ 8 minutes on an H100/H200
    python benchmarks/kv_policy_gpu.py --rows 32k --compiled-rows 32k
    python benchmarks/kv_policy_gpu.py --device cpu --quick  # small shapes on the CPU, seconds (the test suite)

Writes benchmarks/results/kv_policy_gpu.json and .md (``--quick``: kv_policy_gpu_quick.*; ``--out DIR`` elsewhere),
naming the card, torch and transformers.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
import transformers
from transformers import CompileConfig, LlamaConfig, LlamaForCausalLM

import headwise
from headwise.kvcache import KVPolicy
from headwise.kvcache.measure import generate_once

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
ARMS = ("plain-dynamic", "plain-static-compiled", "headwise-full", "policy-eager", "policy-compiled")
COMPILED = {"plain-static-compiled", "policy-compiled"}
ROWS = {"8k": (8192, 1), "32k": (32768, 1), "64k": (65536, 1), "8k-b8": (8192, 8)}
QUICK_ROWS = {"256": (256, 1), "256-b4": (256, 4)}
TARGETS = {"decode": 1.2, "prefill": 1.1, "peak": 0.35, "equal_memory": 2.0}  # issue 41, at half the KV bytes


def model_config(quick: bool) -> LlamaConfig:
    if quick:
        return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
                           num_key_value_heads=2, head_dim=8, vocab_size=512, max_position_embeddings=4096)
    return LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=131072,
                       rope_theta=500000.0)


def build(config: LlamaConfig, device: str, dtype: torch.dtype) -> LlamaForCausalLM:
    """Random weights with the config's shapes, made on the device (no host copy of 15 GiB)."""
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype)
    return model.eval()


def prompts(vocab: int, context: int, batch: int, device: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(context + batch)
    return torch.randint(100, min(vocab, 30000), (batch, context), generator=g).to(device)


def compile_config(device: str) -> CompileConfig:
    config = CompileConfig(fullgraph=True, mode="reduce-overhead" if device == "cuda" else "default")
    config._compile_all_devices = True  # transformers compiles on CUDA only unless asked (the CPU check)
    return config


def set_arm(model: LlamaForCausalLM, arm: str, policy: KVPolicy) -> dict:
    """Put ``model`` in ``arm``'s state; returns the arm's extra ``generate`` options."""
    if headwise.kvcache.policy_of(model) is not None:
        headwise.remove_kv_policy(model)
    if arm.startswith("plain"):
        model.set_attn_implementation("sdpa")
    elif arm == "headwise-full":
        headwise.apply_kv_policy(model, KVPolicy.uniform(model))
    else:
        headwise.apply_kv_policy(model, policy)  # enables the headwise attention; prefill_chunk "auto"
    if hasattr(model, "_compiled_call"):
        del model._compiled_call  # each compiled arm traces its own attention
    if arm in COMPILED:
        return {"cache_implementation": "static", "compile_config": compile_config(model.device.type)}
    return {"disable_compile": True}


def run_arm(model, ids, arm: str, policy: KVPolicy, new: int) -> dict:
    options = set_arm(model, arm, policy)
    generate_once(model, ids, new, 0, **options)  # warm-up at full length: kernels, allocator, compilation
    row = generate_once(model, ids, new, 0, **options)
    row["decode_tokens_per_s"] *= ids.shape[0]  # over the batch
    return row


def regime_ratios(arms: dict) -> dict:
    """The policy against the best full-cache arm of its regime: decode ×, prefill ×, peak ×, KV ×."""
    out = {}
    for policy_arm, rivals in (("policy-eager", ("plain-dynamic", "headwise-full")),
                               ("policy-compiled", ("plain-static-compiled",))):
        present = [arms[r] for r in rivals if r in arms]
        if policy_arm not in arms or not present:
            continue
        best = max(present, key=lambda r: r["decode_tokens_per_s"])
        mine = arms[policy_arm]
        peak = (None if mine["peak_memory_above_start"] is None or not best["peak_memory_above_start"]
                else mine["peak_memory_above_start"] / best["peak_memory_above_start"])
        out[policy_arm] = {"decode": mine["decode_tokens_per_s"] / best["decode_tokens_per_s"],
                           "prefill": mine["prefill_s"] / best["prefill_s"], "peak": peak,
                           "kv": mine["kv_bytes"] / best["kv_bytes"]}
    return out


def equal_memory(model, config, context: int, budget: int, new: int, device: str) -> dict:
    """The largest batch whose KV bytes fit ``budget``, for the full cache and the policy; eager tokens/s there."""
    policy, _ = headwise.kv_policy(model, None, kv_budget=0.5, context=context, ranking="random", progress=False)
    itemsize = next(model.parameters()).element_size()
    out = {}
    for arm, rules in (("plain-dynamic", KVPolicy.uniform(model)), ("policy-eager", policy)):
        per_row = rules.kv_bytes(context + new, config.head_dim, itemsize)
        batch = max(1, budget // per_row)
        ids = prompts(config.vocab_size, context, batch, device)
        row = run_arm(model, ids, arm, policy, new)
        out[arm] = {"batch": batch, "decode_tokens_per_s": row["decode_tokens_per_s"], "kv_bytes": row["kv_bytes"],
                    "peak_memory_above_start": row["peak_memory_above_start"]}
        del ids
    out["ratio"] = out["policy-eager"]["decode_tokens_per_s"] / out["plain-dynamic"]["decode_tokens_per_s"]
    return out


def card(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def markdown(result: dict) -> str:
    lines = [f"{result['card']} · torch {result['torch']} · transformers {result['transformers']} · "
             f"{result['model']} · {result['dtype']} · {result['new']} new tokens · one process, each arm warmed up "
             "with a full-length call", "",
             "| row | arm | prefill s | decode tok/s | peak MiB above weights | KV MiB held |", "|---|---|---|---|---|---|"]
    for name, row in result["rows"].items():
        for arm, r in row["arms"].items():
            peak = "—" if r["peak_memory_above_start"] is None else f"{r['peak_memory_above_start'] / 2**20:.0f}"
            lines.append(f"| {name} | {arm} | {r['prefill_s']:.2f} | {r['decode_tokens_per_s']:.1f} | {peak} | "
                         f"{r['kv_bytes'] / 2**20:.1f} |")
    lines += ["", "Policy / best full-cache arm of the same regime (targets: decode ≥ "
              f"{TARGETS['decode']}, prefill ≤ {TARGETS['prefill']}, peak ≤ {TARGETS['peak']}):", "",
              "| row | regime | decode × | prefill × | peak × | KV × |", "|---|---|---|---|---|---|"]
    for name, row in result["rows"].items():
        for arm, r in row["ratios"].items():
            peak = "—" if r["peak"] is None else f"{r['peak']:.2f}"
            lines.append(f"| {name} | {arm} | {r['decode']:.2f} | {r['prefill']:.2f} | {peak} | {r['kv']:.3f} |")
    if result.get("equal_memory"):
        e = result["equal_memory"]
        lines += ["", f"Throughput at equal KV memory ({e['budget_gib']} GiB at {e['context']} tokens; target ≥ "
                  f"{TARGETS['equal_memory']}x): full cache batch {e['plain-dynamic']['batch']} → "
                  f"{e['plain-dynamic']['decode_tokens_per_s']:.1f} tok/s; policy batch {e['policy-eager']['batch']} "
                  f"→ {e['policy-eager']['decode_tokens_per_s']:.1f} tok/s (**{e['ratio']:.2f}x**)"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="small shapes and prompts: checks the script")
    parser.add_argument("--rows", default=None, help="comma-separated rows (default: all of the mode)")
    parser.add_argument("--compiled-rows", default=None,
                        help="rows that also run the compiled arms (default: 32k,8k-b8; quick: all)")
    parser.add_argument("--new", type=int, default=None, help="new tokens per generate (default 64; quick 8)")
    parser.add_argument("--dtype", default=None, help="default bfloat16 (quick: float32)")
    parser.add_argument("--kv-budget-gib", type=float, default=None,
                        help="KV memory for the equal-memory rows (default 24; quick 0.002; 0: skip)")
    parser.add_argument("--equal-context", type=int, default=None, help="prompt tokens there (default 8192)")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but no CUDA device is visible; run with --device cpu --quick to check the script")
    rows_all = QUICK_ROWS if args.quick else ROWS
    names = args.rows.split(",") if args.rows else list(rows_all)
    unknown = [n for n in names if n not in rows_all]
    if unknown:
        parser.error(f"unknown rows {unknown}; choose from {', '.join(rows_all)}")
    compiled = set(args.compiled_rows.split(",") if args.compiled_rows is not None
                   else (rows_all if args.quick else ("32k", "8k-b8")))
    new = args.new or (8 if args.quick else 64)
    dtype = getattr(torch, args.dtype or ("float32" if args.quick else "bfloat16"))
    budget_gib = args.kv_budget_gib if args.kv_budget_gib is not None else (0.002 if args.quick else 24.0)
    equal_context = args.equal_context or (256 if args.quick else 8192)

    started = time.perf_counter()
    config = model_config(args.quick)
    model = build(config, args.device, dtype)
    result = {"card": card(args.device), "torch": torch.__version__, "transformers": transformers.__version__,
              "model": "random Llama (quick shapes)" if args.quick else "random Llama-3-8B shapes",
              "dtype": str(dtype).removeprefix("torch."), "new": new, "rows": {}}
    for name in names:
        context, batch = rows_all[name]
        policy, _ = headwise.kv_policy(model, None, kv_budget=0.5, context=context, ranking="random",
                                       progress=False)
        ids = prompts(config.vocab_size, context, batch, args.device)
        arms = {}
        for arm in ARMS:
            if arm in COMPILED and name not in compiled:
                continue
            arms[arm] = run_arm(model, ids, arm, policy, new)
            print(f"{name} {arm}: prefill {arms[arm]['prefill_s']:.2f} s, decode "
                  f"{arms[arm]['decode_tokens_per_s']:.1f} tok/s ({time.perf_counter() - started:.0f} s)", flush=True)
        result["rows"][name] = {"context": context, "batch": batch, "policy": policy.describe(), "arms": arms,
                                "ratios": regime_ratios(arms)}
        del ids
    if budget_gib > 0:
        result["equal_memory"] = {"budget_gib": budget_gib, "context": equal_context,
                                  **equal_memory(model, config, equal_context, int(budget_gib * 2**30), new,
                                                 args.device)}
    result["seconds"] = time.perf_counter() - started
    out = args.out or RESULTS
    out.mkdir(parents=True, exist_ok=True)
    stem = "kv_policy_gpu_quick" if args.quick else "kv_policy_gpu"
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    (out / f"{stem}.md").write_text(markdown(result))
    print(markdown(result))
    print(f"wrote {out / stem}.json / .md in {result['seconds']:.0f} s")


if __name__ == "__main__":
    main()
