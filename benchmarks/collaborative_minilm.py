"""Collaborative heads on the packaged MiniLM: parameters, embedding cosine, STS-B dev vs. D~k, and re-fine-tuning.

    python benchmarks/collaborative_minilm.py zero-shot          # every D~k, weight and data-aware objectives
    python benchmarks/collaborative_minilm.py finetune 192 none   # re-fine-tune (none = the uncompressed model)
    STEPS=150 python benchmarks/collaborative_minilm.py finetune 192 none   # a shorter fine-tune (default: 1 epoch)

Calibration: 2000 distinct STS-B *train* sentences sampled with seed 0 (the file is sorted by genre: its first 2000
are all image captions, which under-represent the longer news and forum sentences of dev and cost 0.005 of cosine at
D~k = 192); cosine and Spearman on STS-B dev. Results are kept in
docs/collaborative-minilm-results.json between phases and rendered into docs/benchmarks.md.
"""

from __future__ import annotations

import copy
import json
import os
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from scipy.stats import spearmanr

import headwise
from common import machine, update_section
from headwise.collaborative import compress, input_moments
from headwise.tasks import encode, read_stsb
from headwise.training import finetune_stsb

DKS = [384, 256, 192, 128, 64]
CACHE = Path(__file__).parent.parent / "docs" / "collaborative-minilm-results.json"
STEPS = int(os.environ.get("STEPS", -1))  # -1: one epoch


def measure(model, tokenizer, dev, reference) -> dict:
    sentences = dev.sentences()
    emb = encode(model, tokenizer, sentences, progress=False)
    index = {s: i for i, s in enumerate(sentences)}
    cos = F.cosine_similarity(emb[[index[s] for s in dev.first]], emb[[index[s] for s in dev.second]]).numpy()
    return {"cosine": F.cosine_similarity(emb, reference).mean().item(),
            "spearman": 100 * spearmanr(cos, dev.scores).statistic}


def qk_params(model) -> int:
    names = ("query", "key", "mixing", "content_bias")
    return sum(p.numel() for n, p in model.named_parameters() if any(f".{k}" in n for k in names))


def compress_1t(*args, **kwargs):
    """Decompose on one thread: many small ops, and OpenMP spinning on a shared 2-core machine costs ~100×."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return compress(*args, **kwargs)
    finally:
        torch.set_num_threads(threads)


def main() -> None:
    phase = sys.argv[1]
    results = json.loads(CACHE.read_text()) if CACHE.exists() else {}
    model, tokenizer = headwise.load_model()
    dev = read_stsb("dev")
    reference = encode(model, tokenizer, dev.sentences(), progress=False)
    calibration = random.Random(0).sample(read_stsb("train").sentences(), 2000)
    if phase == "zero-shot":
        results["original"] = {"params": qk_params(model), **measure(model, tokenizer, dev, reference)}
        moments = input_moments(model, headwise.find_sites(model), calibration, tokenizer, progress=False)
        for dk in DKS:
            for objective in ("weights", "scores"):
                m = copy.deepcopy(model)
                start = time.perf_counter()
                r = compress_1t(m, dk=dk, moments=moments if objective == "scores" else None, progress=False)
                row = {"params": qk_params(m), "seconds": time.perf_counter() - start,
                       "weight_error": sum(s.weight_error for s in r.sites) / len(r.sites),
                       **measure(m, tokenizer, dev, reference)}
                results[f"{dk}/{objective}"] = row
                print(dk, objective, row, flush=True)
    else:
        dks = sys.argv[2:]
        if any(arg != "none" for arg in dks):
            moments = input_moments(model, headwise.find_sites(model), calibration, tokenizer, progress=False)
        for arg in dks:
            m = copy.deepcopy(model)
            if arg != "none":
                compress_1t(m, dk=int(arg), moments=moments, progress=False)
            start = time.perf_counter()
            finetune_stsb(m, tokenizer, epochs=1, max_steps=STEPS, progress=False)
            row = {"finetune_seconds": time.perf_counter() - start, **measure(m, tokenizer, dev, reference)}
            results[f"finetuned/{arg}"] = row
            print(arg, row, flush=True)
            CACHE.write_text(json.dumps(results, indent=1))  # after every run: a killed job keeps what it finished
    CACHE.write_text(json.dumps(results, indent=1))
    if "original" in results:
        render(results)


def render(results: dict) -> None:
    o = results["original"]
    tuned = results.get("finetuned/none", {}).get("spearman")
    lines = [
        "### Collaborative heads on MiniLM (STS-B dev)",
        "",
        f"Machine: {machine()}. Calibration (data-aware): 2000 STS-B train sentences. Cosine: mean cosine of the "
        "mean-pooled dev-sentence embeddings to the original model's. Re-fine-tuning: `finetune_stsb`, 1 epoch of "
        "STS-B train (the same recipe for the uncompressed baseline). q/k parameters: query, key, mixing and content "
        "bias of all 6 layers. `python benchmarks/collaborative_minilm.py zero-shot; ... finetune 192 none`.",
        "",
        "| D~k | q/k parameters | objective | weight error | cosine | STS-B dev zero-shot | after re-fine-tuning |",
        "|---|---|---|---|---|---|---|",
        f"| original (12 × 32) | {o['params']:,} | – | – | 1.0000 | {o['spearman']:.2f} | "
        f"{tuned:.2f} |" if tuned else f"| original | {o['params']:,} | – | – | 1.0000 | {o['spearman']:.2f} | – |",
    ]
    for dk in DKS:
        for objective in ("weights", "scores"):
            row = results.get(f"{dk}/{objective}")
            if row is None or (dk == 384 and objective == "scores"):
                continue
            ft = results.get(f"finetuned/{dk}", {}).get("spearman") if objective == "scores" else None
            label = "exact" if dk == 384 else ("data-aware" if objective == "scores" else "weights")
            lines.append(f"| {dk} | {row['params']:,} | {label} | {row['weight_error']:.3f} | {row['cosine']:.4f} | "
                         f"{row['spearman']:.2f} | {'–' if ft is None else f'{ft:.2f}'} |")
    update_section("collaborative-minilm", "\n".join(lines))


if __name__ == "__main__":
    main()
