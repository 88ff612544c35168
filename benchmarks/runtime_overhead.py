"""Cost of the headwise runtime: MiniLM forward, batch 32 × 128 tokens, headwise + gates vs. plain SDPA.

Side by side in one process, interleaved, medians of several runs. Writes a section of docs/benchmarks.md.
Run: ``python benchmarks/runtime_overhead.py [--repeats 9]``.
"""

from __future__ import annotations

import argparse
import copy

import torch
from common import interleaved, machine, median, update_section

import headwise
from headwise.tasks import read_stsb


def inputs(tokenizer, batch: int, length: int) -> dict:
    """``batch`` rows of real STS-B text, each exactly ``length`` tokens (no padding)."""
    words = " ".join(read_stsb("dev").first).split()
    step = 150
    texts = [" ".join(words[i * step : (i + 1) * step]) for i in range(batch)]
    return tokenizer(texts, truncation=True, max_length=length, padding="max_length", return_tensors="pt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=128)
    args = parser.parse_args()

    model, tokenizer = headwise.load_model()
    batch = inputs(tokenizer, args.batch, args.length)
    sdpa = copy.deepcopy(model)
    sdpa.set_attn_implementation("sdpa")
    gated = copy.deepcopy(model)
    headwise.add_gates(gated)
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")

    def run(m):
        return lambda: m(**batch)

    with torch.inference_mode():
        times = interleaved({"sdpa": run(sdpa), "headwise+gates": run(gated), "headwise": run(model),
                             "eager": run(eager)}, repeats=args.repeats)
    base = median(times["sdpa"])
    rows = [f"| {name} | {median(ts) * 1e3:.1f} | {median(ts) / base:.3f} |" for name, ts in times.items()]
    table = "\n".join(["| implementation | median ms / batch | ratio vs sdpa |", "|---|---|---|", *rows])
    md = (f"## Runtime overhead (foundation)\n\nMiniLM (6 × 12 heads), batch {args.batch} × {args.length} tokens, "
          f"forward, inference mode, {args.repeats} interleaved runs, medians. Machine: {machine()}. "
          "Goal: headwise + gates ≤ 1.10 × sdpa.\n\n" + table)
    print(md)
    update_section("runtime-overhead", md)


if __name__ == "__main__":
    main()
