"""Throughput of vLLM serving SmolLM2 with the full cache against the same model under headwise's 0.5 per-head
KV policy (the headwise-vllm plugin), at equal KV cache memory (issue 69, docs/serving.md).

Two steps, in two environments (vLLM cannot share headwise's, docs/serving.md):

    python benchmarks/vllm_serving.py prepare --dir /tmp/vllm-bench          # headwise's: the two folders
    ~/.cache/headwise/venv-vllm-0.32.0/bin/python benchmarks/vllm_serving.py run --dir /tmp/vllm-bench

``prepare`` writes ``DIR/full`` (the plain model) and ``DIR/policy`` (``export_vllm`` of
``kv_policy(kv_budget=0.5, context=--context, ranking="random", scaled=False)``: the bytes are the ranking's, not
its quality). ``run`` starts one engine per folder (float32, ``--kv-gib`` of KV cache, ``max_model_len`` =
``--context``, ``--chunk``-token prefill steps), submits ``--requests`` prompts of seeded random ids with lengths
drawn uniformly from ``--min-len`` to ``--max-len`` (the same prompts for both), ``--new`` tokens each, all at once,
and times the whole batch: output tokens/s and prompt + output tokens/s per arm, their ratio (policy / full), and
vLLM's KV capacity (tokens, maximum concurrency) beside it. Writes benchmarks/results/vllm_serving_<device>.json
and .md. Time it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def prepare(args: argparse.Namespace) -> None:
    import headwise
    from headwise.clients.vllm import export_vllm
    from headwise.io import export_plain
    from headwise.kvcache import apply_kv_policy, kv_policy

    model, tokenizer = headwise.load_model("smollm2-135m", task="lm", dtype="float32")
    root = Path(args.dir)
    export_plain(model, root / "full", tokenizer=tokenizer, overwrite=True)
    policy, _ = kv_policy(model, tokenizer, kv_budget=0.5, context=args.context, sink=0, ranking="random",
                          scaled=False, progress=False)
    apply_kv_policy(model, policy)
    print(export_vllm(model, root / "policy", tokenizer=tokenizer, overwrite=True).describe())
    print(policy.describe())


def run_arm(folder: Path, prompts: list[list[int]], args: argparse.Namespace) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=str(folder), dtype="float32", kv_cache_memory_bytes=int(args.kv_gib * (1 << 30)),
              max_model_len=args.context, max_num_batched_tokens=args.chunk, enforce_eager=args.eager, seed=0)
    cache = llm.llm_engine.vllm_config.cache_config
    params = SamplingParams(temperature=0.0, max_tokens=args.new, ignore_eos=True)
    llm.generate([TokensPrompt(prompt_token_ids=prompts[0][:64])], params, use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    seconds = time.perf_counter() - start
    new = sum(len(o.outputs[0].token_ids) for o in outs)
    total = new + sum(len(p) for p in prompts)
    result = {"seconds": round(seconds, 2), "output_tokens_per_s": round(new / seconds, 2),
              "tokens_per_s": round(total / seconds, 2), "kv_cache_tokens": cache.kv_cache_size_tokens,
              "max_concurrency": round(cache.kv_cache_max_concurrency, 3)}
    del llm
    return result


def run(args: argparse.Namespace) -> None:
    import torch
    import vllm

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 49000) for _ in range(rng.randint(args.min_len, args.max_len))]
               for _ in range(args.requests)]
    arms = {name: run_arm(Path(args.dir) / name, prompts, args) for name in ("full", "policy")}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    result = {"device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
              "cpus": os.cpu_count(), "vllm": vllm.__version__, "torch": torch.__version__,
              "settings": {k: v for k, v in vars(args).items() if k not in ("step", "dir")}, "arms": arms,
              "ratio": {k: round(arms["policy"][k] / arms["full"][k], 3)
                        for k in ("output_tokens_per_s", "tokens_per_s", "kv_cache_tokens", "max_concurrency")}}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"vllm_serving_{device}.json").write_text(json.dumps(result, indent=1) + "\n")
    rows = [f"| {name} | {a['kv_cache_tokens']:,} | {a['max_concurrency']:.2f}x | {a['output_tokens_per_s']:.1f} | "
            f"{a['tokens_per_s']:.1f} | {a['seconds']:.0f} |" for name, a in arms.items()]
    ratio = result["ratio"]
    (RESULTS / f"vllm_serving_{device}.md").write_text("\n".join([
        f"# vLLM: full cache vs headwise's 0.5 policy (plugin), {result['device']}, vLLM {result['vllm']}", "",
        f"{args.requests} requests of {args.min_len}-{args.max_len} random tokens + {args.new} new, all at once; "
        f"{args.kv_gib} GiB of KV cache, max_model_len {args.context}, {args.chunk}-token chunks.", "",
        "| arm | KV cache (tokens) | max. concurrency | output tokens/s | prompt + output tokens/s | seconds |",
        "|---|---|---|---|---|---|", *rows, "",
        f"policy / full: output tokens/s {ratio['output_tokens_per_s']:.2f}x, prompt + output "
        f"{ratio['tokens_per_s']:.2f}x, KV capacity {ratio['kv_cache_tokens']:.2f}x", ""]))
    print(json.dumps(result, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["prepare", "run"])
    parser.add_argument("--dir", required=True, help="where prepare writes the two folders and run reads them")
    parser.add_argument("--context", type=int, default=8192, help="max_model_len, and the policy's length")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--min-len", type=int, default=2048)
    parser.add_argument("--max-len", type=int, default=7936)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--kv-gib", type=float, default=1.0)
    parser.add_argument("--chunk", type=int, default=512, help="max_num_batched_tokens")
    parser.add_argument("--eager", action="store_true", help="enforce_eager (no torch.compile)")
    args = parser.parse_args()
    (prepare if args.step == "prepare" else run)(args)


if __name__ == "__main__":
    main()
