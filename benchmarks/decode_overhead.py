"""What the headwise attention itself costs per decoding step, with nothing attached (no policy, gates or observers):
greedy ``generate()`` through the same model with ``attn_implementation="sdpa"`` and ``"headwise"``, eager (the
dynamic cache) and compiled (transformers' static cache + ``torch.compile``), arms alternating in one process,
medians of ``--repeats`` timed calls after a warm-up call each.

    python benchmarks/decode_overhead.py                         # SmolLM2-135M, 256-token prompt, 32 new tokens
    python benchmarks/decode_overhead.py --no-compiled --repeats 3
    python benchmarks/decode_overhead.py --device cuda --dtype bfloat16 --model llama-1b-random

Writes benchmarks/results/decode_overhead_<device>.json and .md. Target (issue 41): headwise ≤ 1.05x SDPA's step
time, eager and compiled.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, CompileConfig, LlamaConfig

import headwise
from headwise.kvcache.measure import generate_once

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TARGET = 1.05


def load(name: str, device: str, dtype: torch.dtype):
    if name == "llama-1b-random":
        config = LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                             num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True)
        torch.manual_seed(0)
        with torch.device(device):
            return AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    from headwise.models import resolve_model

    return AutoModelForCausalLM.from_pretrained(resolve_model(name), dtype=dtype).to(device).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="smollm2-135m or llama-1b-random")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-compiled", action="store_true", help="only the eager arms")
    args = parser.parse_args()

    model = load(args.model, args.device, getattr(torch, args.dtype))
    ids = torch.randint(100, 30000, (1, args.prompt), generator=torch.Generator().manual_seed(0)).to(args.device)
    compiled = CompileConfig(fullgraph=True, mode="reduce-overhead" if args.device == "cuda" else "default")
    compiled._compile_all_devices = True
    regimes = {"eager": {"disable_compile": True}}
    if not args.no_compiled:
        regimes["compiled"] = {"cache_implementation": "static", "compile_config": compiled}
    rates: dict[str, list[float]] = {}
    started = time.perf_counter()
    for regime, options in regimes.items():
        for attention in ("sdpa", "headwise"):  # warm-up, compiling each arm once
            model.set_attn_implementation(attention)
            if hasattr(model, "_compiled_call"):
                del model._compiled_call
            generate_once(model, ids, args.new, 0, **options)
            rates[f"{regime}/{attention}"] = []
        for _ in range(args.repeats):
            for attention in ("sdpa", "headwise"):
                model.set_attn_implementation(attention)
                if hasattr(model, "_compiled_call"):
                    del model._compiled_call
                row = generate_once(model, ids, args.new, 0, **options)
                rates[f"{regime}/{attention}"].append(row["decode_tokens_per_s"])
    medians = {arm: statistics.median(r) for arm, r in rates.items()}
    ratios = {regime: medians[f"{regime}/sdpa"] / medians[f"{regime}/headwise"] for regime in regimes}
    result = {"model": args.model, "device": args.device, "dtype": args.dtype, "prompt": args.prompt,
              "new": args.new, "repeats": args.repeats, "torch": torch.__version__, "threads": torch.get_num_threads(),
              "tokens_per_s": rates, "median_tokens_per_s": medians,
              "step_time_headwise_over_sdpa": ratios, "seconds": time.perf_counter() - started}
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / f"decode_overhead_{args.device}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    lines = [f"{args.model}, {args.dtype}, {args.device} ({torch.get_num_threads()} threads), torch {torch.__version__}; "
             f"{args.prompt}-token prompt, {args.new} new tokens, medians of {args.repeats} alternating calls", "",
             "| regime | SDPA tok/s | headwise tok/s | step time headwise / SDPA | target |", "|---|---|---|---|---|"]
    for regime in regimes:
        ratio = ratios[regime]
        lines.append(f"| {regime} | {medians[f'{regime}/sdpa']:.1f} | {medians[f'{regime}/headwise']:.1f} | "
                     f"{ratio:.3f}x | {'✓' if ratio <= TARGET else '✗'} ≤ {TARGET} |")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
