"""Real cost of attention quantization: MiniLM forward, batch 32 × 128 tokens, quantized (fake quant on the
explicit softmax path) vs. plain ``eager`` vs. ``sdpa``.

Side by side in one process, interleaved, medians of several runs. Writes a section of docs/benchmarks.md.
Run: ``python benchmarks/quantization_cost.py [--repeats 7]``.
"""

from __future__ import annotations

import argparse
import copy

import torch
from common import interleaved, machine, median, update_section
from runtime_overhead import inputs

import headwise
from headwise.quantization import quantize_attention

SETTINGS = {  # name -> QuantizationConfig fields
    "explicit softmax, unquantized": {"method": "none"},
    "prune >0.01": {"method": "none", "threshold": 0.01},
    "linear_slog_clamped_midval 3b": {"method": "linear_slog_clamped_midval", "bits": 3},
    "linear_slinear 3b": {"method": "linear_slinear", "bits": 3},
    "uniform_slog_clamped_mean 3b": {"method": "uniform_slog_clamped_mean", "bits": 3},
    "uniform_slog_mean 3b (example scope)": {"method": "uniform_slog_mean", "bits": 3, "scope": "example"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=128)
    args = parser.parse_args()

    model, tokenizer = headwise.load_model()
    batch = inputs(tokenizer, args.batch, args.length)
    models = {}
    for name in ("sdpa", "eager"):
        models[name] = copy.deepcopy(model)
        models[name].set_attn_implementation(name)
    for name, options in SETTINGS.items():
        models[name] = copy.deepcopy(model)
        quantize_attention(models[name], **options)

    with torch.inference_mode():
        times = interleaved({name: (lambda m=m: m(**batch)) for name, m in models.items()}, repeats=args.repeats)
    sdpa, eager = median(times["sdpa"]), median(times["eager"])
    rows = [f"| {name} | {median(ts) * 1e3:.1f} | {median(ts) / sdpa:.2f} | {median(ts) / eager:.2f} |"
            for name, ts in times.items()]
    table = "\n".join(["| forward | median ms / batch | ratio vs sdpa | ratio vs eager |", "|---|---|---|---|", *rows])
    md = (f"## Attention quantization cost (fake quant)\n\nMiniLM (6 × 12 heads), batch {args.batch} × "
          f"{args.length} tokens, forward, inference mode, {args.repeats} interleaved runs, medians. Machine: "
          f"{machine()}. Quantized rows run headwise's explicit softmax path with the quantizer as a probability op "
          "(float32 storage, float32 `A·V`): this is the cost of *simulating* quantized attention; memory and "
          "speed gains need integer kernels, which headwise does not provide.\n\n" + table)
    print(md)
    update_section("quantization-cost", md)


if __name__ == "__main__":
    main()
