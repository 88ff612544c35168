"""MiniLM on STS-B dev with each mechanism replacing softmax in all 6 layers: zero-shot and after a short fine-tune.

Settings are chosen for STS-B's short sentences (median ~13 tokens) so that every mechanism really approximates
(windows and chunks shorter than the sentences). The fine-tune is the shared recipe (``finetune_stsb``: cosine
regression on STS-B train, batch 16, lr 2e-5) for the same fixed number of steps for every row, the plain softmax
baseline included. Writes the ``mechanisms-stsb`` section of docs/benchmarks.md.

    python benchmarks/mechanisms_stsb.py [--steps 60] [--only zero-shot]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from common import machine, update_section

import headwise
from headwise.mechanisms import use

ROWS = {  # label -> (mechanism or None for plain softmax, args)
    "softmax (SDPA, unchanged)": (None, {}),
    "local w=4": ("local", {"window": 4}),
    "linear (elu+1)": ("linear", {}),
    "performer m=64": ("performer", {"features": 64}),
    "rfa m=64 τ=1": ("rfa", {"features": 64}),
    "nystrom m=4": ("nystrom", {"landmarks": 4}),
    "eva w=4 c=2": ("eva", {"window": 4, "chunk_size": 2}),
    "eva-paper w=4 C=4 (adaptive maps untrained at zero-shot)": ("eva-paper", {"window": 4, "num_landmarks": 4}),
    "lara C=4": ("lara", {"num_landmarks": 4}),
    "ra (1 sample)": ("ra", {}),
    "scatterbrain w=4 m=64": ("scatterbrain", {"window": 4, "features": 64}),
    "scatterbrain w=8 m=64": ("scatterbrain", {"window": 8, "features": 64}),
    "scatterbrain sliding w=4 m=64": ("scatterbrain", {"window": 4, "features": 64, "mode": "sliding"}),
}


def fresh(label: str):
    model, tokenizer = headwise.load_model()
    name, args = ROWS[label]
    if name is not None:
        use(model, name, **args)
    return model, tokenizer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--only", choices=["zero-shot", "all"], default="all")
    parser.add_argument("--out", default="/tmp/mechanisms_stsb.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    path = Path(args.out)
    results = json.loads(path.read_text()) if path.exists() else {}
    for label in ROWS:
        row = results.setdefault(label, {})
        if "zero_shot" not in row:
            model, tokenizer = fresh(label)
            start = time.perf_counter()
            row["zero_shot"] = headwise.evaluate_stsb(model, tokenizer).spearman
            row["eval_s"] = time.perf_counter() - start
            path.write_text(json.dumps(results, indent=1))
            print(label, row, flush=True)
    if args.only == "all":
        from headwise.training import finetune_stsb

        for label in ROWS:
            row = results[label]
            if "finetuned" not in row:
                model, tokenizer = fresh(label)
                finetune_stsb(model, tokenizer, max_steps=args.steps, progress=False, seed=0)
                row["finetuned"] = headwise.evaluate_stsb(model, tokenizer).spearman
                path.write_text(json.dumps(results, indent=1))
                print(label, row, flush=True)
    lines = [
        "## Efficient mechanisms in MiniLM: STS-B dev Spearman × 100",
        "",
        "all-MiniLM-L6-v2 (packaged), the mechanism at all 6 attention sites with the pretrained q/k/v/o weights "
        "(`headwise.mechanisms.use`). Settings sized for STS-B's short sentences. Fine-tuned: the shared recipe "
        f"(`finetune_stsb`, cosine regression on STS-B train, batch 16, lr 2e-5) for {args.steps} steps "
        f"({args.steps * 16} pairs), same for every row. Machine: {machine()}. Reproduce: "
        "`python benchmarks/mechanisms_stsb.py`.",
        "",
        "| attention | zero-shot | fine-tuned | dev eval s |",
        "|---|---|---|---|",
    ]
    for label, row in results.items():
        tuned = f"{row['finetuned']:.2f}" if "finetuned" in row else "–"
        lines.append(f"| {label} | {row['zero_shot']:.2f} | {tuned} | {row['eval_s']:.1f} |")
    text = "\n".join(lines)
    print(text)
    update_section("mechanisms-stsb", text)


if __name__ == "__main__":
    main()
