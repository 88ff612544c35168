"""STS-B experiment for head mixing and swapping (numbers in docs/mixing.md).

Every arm fine-tunes the packaged MiniLM with the same recipe (``finetune_stsb``: batch 16, lr 2e-5, 10% warm-up,
``--steps`` updates, seed 0) and is scored on STS-B dev (Spearman × 100):

- ``baseline``: plain fine-tuning;
- ``mix-grow``: alpha mixers + nuclear-norm term pushing norms up (MHR's direction, radius form);
- ``mix-shrink``: alpha mixers + nuclear-norm term pushing norms down;
- ``swap-manual``: all 12 heads of layers 1 and 4 swapped for steps 30-74 and 100-124 (MHR's shipped schedule
  swaps two layers' heads for a few epochs and swaps them back);
- ``swap-dynamic``: soft dynamic swapping, one round = 50 steps, confidence measured on 64 dev sentences.

Mixing arms are folded (``fold_mixing``) before scoring; the script checks the folded score equals the unfolded one.
Run: ``flock /tmp/headwise-cpu.lock python benchmarks/mixing_stsb.py --out mixing-stsb``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import headwise
from headwise.tasks import read_stsb
from headwise.mixing import (DynamicSwap, DynamicSwapConfig, MixingConfig, NuclearNormPenalty, NuclearNormTraining,
                             SwapSchedule, add_mixers, alpha_table, fold_mixing, head_distances)
from headwise.report import Report
from headwise.report.mixing import add_mixing_section
from headwise.training import finetune_stsb

HEAD_LR = 1e-2


def manual_schedule() -> dict:
    swaps = [f"enc-self.1:{h} <-> enc-self.4:{h}" for h in range(12)]
    return {"30": swaps, "75": swaps, "100": swaps, "125": swaps}


def run_arm(name: str, steps: int, gamma: float, texts: list[str]) -> dict:
    model, tok = headwise.load_model()
    out: dict = {"name": name}
    penalties, callbacks = [], []
    if name.startswith("mix"):
        add_mixers(model, MixingConfig())
        term = NuclearNormPenalty(model, NuclearNormTraining(gamma=gamma, direction=name.split("-")[1], radius=1e-2))
        penalties, callbacks = [term], [term]
        out["nuclear_before"] = {n: a["nuclear_norm"] for n, a in alpha_table(model).items()}
    elif name == "swap-manual":
        callbacks = [SwapSchedule(model, manual_schedule(), unit="step")]
    elif name == "swap-dynamic":
        callbacks = [DynamicSwap(model, DynamicSwapConfig(kind="enc-self", method="soft", metric="confidence",
                                                          start=1, frequency=1, rest=1, end=3, max_switches=1,
                                                          period=50), tokenizer=tok, texts=texts[:64])]
    start = time.perf_counter()
    finetune_stsb(model, tok, max_steps=steps, penalties=penalties, callbacks=callbacks,
                  head_learning_rate=HEAD_LR if penalties else None, progress=False, logging_steps=50)
    out["train_s"] = round(time.perf_counter() - start, 1)
    if name.startswith("mix"):
        out["alphas"] = alpha_table(model)
        out["distances"] = head_distances(model, tok, texts[:200])
        out["spearman_unfolded"] = headwise.evaluate_stsb(model, tok, "dev").spearman
        fold_mixing(model)
    elif name == "baseline":
        add_mixers(model)  # identity mixers: a probe for the head distances of the plain model
        out["distances"] = head_distances(model, tok, texts[:200])
        fold_mixing(model)
    if name.startswith("swap"):
        out["swaps"] = [[s, str(w)] for s, w in callbacks[0].applied] if name == "swap-manual" else \
            [[c, what, [str(s) for s in swaps]] for c, what, swaps in callbacks[0].history]
    out["spearman"] = headwise.evaluate_stsb(model, tok, "dev").spearman
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--gamma", type=float, default=0.1)
    parser.add_argument("--arms", default="baseline,mix-grow,mix-shrink,swap-manual,swap-dynamic")
    parser.add_argument("--out", default="mixing-stsb")
    args = parser.parse_args()
    torch.set_num_threads(2)
    dev = read_stsb("dev")
    texts = list(dict.fromkeys(dev.first + dev.second))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for arm in args.arms.split(","):
        results[arm] = run_arm(arm, args.steps, args.gamma, texts)
        print(arm, {k: v for k, v in results[arm].items() if k not in ("alphas", "distances")}, flush=True)
        (out / "results.json").write_text(json.dumps(results, indent=1))
    report = Report("headwise mixing on STS-B", f"MiniLM, {args.steps} steps, γ = {args.gamma}")
    for arm, r in results.items():
        if "alphas" in r:
            add_mixing_section(report, {"title": f"Mixing: {arm}", "alphas": r["alphas"],
                                        "nuclear_before": r["nuclear_before"], "distances": r["distances"],
                                        "arms": {a: {"STS-B dev": v["spearman"]} for a, v in results.items()}})
    report.write(out, overwrite=True)


if __name__ == "__main__":
    main()
