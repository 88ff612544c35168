"""Latency of a physically pruned MiniLM (36 of 72 heads, 6 per layer) vs. the unpruned model.

Batch 32 × 128 tokens, forward in inference mode, both on the default SDPA path, interleaved runs, medians.
"""

from __future__ import annotations

import torch
from common import interleaved, machine, median, update_section

import headwise
from headwise.sites import find_sites

REPEATS = 9


def main() -> None:
    full, _ = headwise.load_model()
    pruned, _ = headwise.load_model()
    headwise.prune_heads(pruned, {s.path: list(range(6, 12)) for s in find_sites(pruned)})
    full.set_attn_implementation("sdpa")
    pruned.set_attn_implementation("sdpa")
    ids = torch.randint(1000, 20000, (32, 128), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)

    def run(model):
        def call():
            with torch.inference_mode():
                model(input_ids=ids, attention_mask=mask)
        return call

    times = interleaved({"unpruned (72 heads)": run(full), "pruned (36 heads)": run(pruned)}, repeats=REPEATS)
    base = median(times["unpruned (72 heads)"])
    params = {name: sum(p.numel() for p in m.parameters()) for name, m in
              (("unpruned (72 heads)", full), ("pruned (36 heads)", pruned))}
    rows = [f"| {name} | {params[name] / 1e6:.2f} M | {median(t) * 1e3:.1f} | {median(t) / base:.3f} |"
            for name, t in times.items()]
    update_section("pruned-latency", "\n".join([
        "## Pruned model latency (pruning)",
        "",
        f"MiniLM, batch 32 × 128 tokens, forward, inference mode, SDPA, {REPEATS} interleaved runs, medians. "
        f"Pruned: heads 6–11 of every layer physically removed with `headwise.prune_heads`. Machine: {machine()}.",
        "",
        "| model | parameters | median ms / batch | ratio vs unpruned |",
        "|---|---|---|---|",
        *rows,
    ]))
    print("\n".join(rows))


if __name__ == "__main__":
    main()
