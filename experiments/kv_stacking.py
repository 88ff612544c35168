"""Per-head KV cache policies stacked on KV-cache conversions of SmolLM2-135M: does a policy still save its share
of bytes, at what perplexity, on a grouped-query (3 → 1 KV heads) or latent (half the KV bytes) model?

Steps (each < 8 CPU-minutes on one thread; results accumulate in ``--out``):
  python experiments/kv_stacking.py build gqa      # convert_gqa 3 → 1 (calibrated) + 2,048 tokens of uptraining
  python experiments/kv_stacking.py build latent   # convert_latent at 0.5 (calibrated) + 2,048 tokens of uptraining
  python experiments/kv_stacking.py build pruned   # KV-head pruning: each layer's least important KV group removed
                                                   # (3 → 2, gradient importance of the LM loss) + the same uptraining
  python experiments/kv_stacking.py arms gqa       # and latent, pruned: full cache, scored policy, StreamingLLM
  python experiments/kv_stacking.py arms original  # copies full / policy / streaming from kv_policy_results.json
  python experiments/kv_stacking.py plot           # docs/kv-stacking.svg (docs/kv-cache.md) from the JSON
  python experiments/kv_stacking.py table          # its markdown table

The conversions are those of experiments/kv_conversion.py (same calibration moments, same uptraining: AdamW 1e-4,
batch 1 × 256 tokens, ``--uptrain-tokens``); the original's arms are the ones experiments/kv_policy.py measured
(same policies, same perplexity windows); converted
models are kept in ``--models`` between steps. Every arm's policy holds half the KV tokens at 1,024 tokens
(``kv_policy``: sink 4 + window 124 on the streaming heads; on the latent model whole layers, since a layer's heads
share one latent; StreamingLLM: sink 4 + window 508 everywhere). Perplexity as in experiments/kv_policy.py: 3
WikiText-2 windows of 1,024 tokens from the last 10% of valid.txt, one prefill each through the policy's cache.
KV bytes per token at 1,024 tokens in 16-bit: what each conversion caches per token (for the latent model, its
latent; transformers' cache still holds decoded keys/values) times the share of tokens the policy keeps.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402
import kv_conversion  # noqa: E402
import kv_policy as policy_experiment  # noqa: E402

import headwise  # noqa: E402
from headwise.conversion import convert_gqa, convert_latent, kv_cache_bytes  # noqa: E402
from headwise.kvcache import KVPolicy, ScoreConfig, apply_kv_policy, kv_policy, streaming  # noqa: E402
from headwise.models import resolve_model  # noqa: E402
from headwise.pruning import importance_pruning, prune_masked  # noqa: E402
from headwise.tasks import LanguageModeling  # noqa: E402

RESULTS = common.EXPERIMENTS / "kv_stacking.json"
SINK, WINDOW, LENGTH, BUDGET = 4, 124, 1024, 0.5


def build(kind: str, models: Path, tokens: int, data: Path) -> dict:
    path = resolve_model("smollm2-135m")
    tokenizer = AutoTokenizer.from_pretrained(path)
    calib_ids, _ = kv_conversion.split_tokens(tokenizer, data)
    moments = kv_conversion.moments_of(path, kv_conversion.windows(calib_ids, 16384), Path("/tmp/headwise-kv-moments.pt"))
    attention = {"attn_implementation": "headwise"} if kind == "pruned" else {}  # masks run in headwise's attention
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **attention).eval()
    start = time.time()
    if kind == "pruned":  # every layer keeps its 2 most important KV groups (min_per_site counts groups here)
        rank = LanguageModeling(data=str(data), max_length=256)
        inputs = rank.batches(tokenizer, "train", batch_size=4, limit=16)
        importance_pruning(model, tokenizer, inputs=inputs, loss_fn=rank.loss, unit="kv-group", keep=[180],
                           min_per_site=2, progress=False)
        prune_masked(model)
    elif kind == "gqa":
        convert_gqa(model, kv_heads=1, init="calibrated", moments=moments)
    else:
        convert_latent(model, kv_budget=0.5, init="calibrated", moments=moments)
    trained = kv_conversion.uptrain(model, calib_ids[:tokens], 256, 1e-4) if tokens else {}
    headwise.save_pretrained(model, models / kind, tokenizer=tokenizer, overwrite=True)
    return {**trained, "seconds": round(time.time() - start, 1), "kv_bytes_per_token_fp16": kv_cache_bytes(model, 2)}


def load(kind: str, models: Path):
    if kind == "original":
        path = resolve_model("smollm2-135m")
        model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="headwise", dtype=torch.float32)
        return model.eval(), AutoTokenizer.from_pretrained(path)
    if not (models / kind).is_dir():
        raise SystemExit(f"run `build {kind}` first")
    return headwise.from_pretrained(models / kind).eval(), AutoTokenizer.from_pretrained(models / kind)


def original_arms() -> dict:
    """The original model's full / policy / streaming arms as experiments/kv_policy.py measured them."""
    measured = policy_experiment.load(policy_experiment.RESULTS)
    per_token = 23040  # 30 layers x 3 KV heads x 2 x 64 values x 2 bytes
    rows = {}
    for name in ("full", "policy", "streaming"):
        arm = measured["arms"][name]
        fraction = arm["kv_fraction"][str(LENGTH)]
        rows[name] = {"policy": arm["policy"], "kv_fraction": fraction,
                      "kv_bytes_per_token_fp16": round(per_token * fraction), "ppl": arm["wikitext2"]["ppl"]}
    return {"source": "experiments/kv_policy_results.json", "kv_bytes_per_token_fp16_full": per_token,
            "full_heads": measured["scores"]["seeds"]["0"]["full_heads"]["combined"], "arms": rows}


def arms(kind: str, models: Path, data: Path) -> dict:
    if kind == "original":
        return original_arms()
    model, tokenizer = load(kind, models)
    calib, _ = policy_experiment.wikitext_lines(data)
    joined = " ".join(calib)
    pieces = [joined[i: i + 3000] for i in range(0, len(joined) - 3000, 3000)]
    start = time.time()
    chosen, _ = kv_policy(model, tokenizer, BUDGET, LENGTH, SINK, WINDOW, "combined",
                          texts=random.Random(0).sample(pieces, 2),
                          config=ScoreConfig(length=512, keys=1, sink=SINK, window=WINDOW, seed=0))
    scoring = round(time.time() - start, 1)
    rules = {"full": KVPolicy.uniform(model), "policy": chosen,
             "streaming": KVPolicy.uniform(model, streaming(SINK, int(BUDGET * LENGTH) - SINK))}
    ppl_args = argparse.Namespace(data=data, chunks=3, length=LENGTH)
    per_token = kv_cache_bytes(model, 2)
    rows = {}
    for name, rule in rules.items():
        apply_kv_policy(model, rule)
        fraction = rule.kv_fraction(LENGTH)
        rows[name] = {"policy": rule.describe(), "kv_fraction": round(fraction, 4),
                      "kv_bytes_per_token_fp16": round(per_token * fraction),
                      "ppl": policy_experiment.perplexity(model, tokenizer, ppl_args)["ppl"]}
        print(kind, name, rows[name], flush=True)
    return {"scoring_seconds": scoring, "kv_bytes_per_token_fp16_full": per_token,
            "full_heads": [list(p) for p in chosen.full_heads()], "arms": rows}


def plot(results: dict) -> str:
    """Perplexity vs KV bytes: per conversion, a line from its full cache to each policy at half the tokens."""
    from headwise.report import svg

    names = {"original": "original", "gqa": "GQA 3→1 +uptrain", "latent": "latent 50% +uptrain",
             "pruned": "KV-head pruning 3→2 +uptrain"}
    series = {}
    for kind, label in names.items():
        rows = results.get("arms", {}).get(kind, {}).get("arms")
        for arm, marker in (("policy", "headwise policy"), ("streaming", "StreamingLLM")) if rows else ():
            points = [rows["full"], rows[arm]]
            series[f"{label}: full → {marker}"] = ([p["kv_bytes_per_token_fp16"] / 1024 for p in points],
                                                   [p["ppl"] for p in points])
    return svg.lines(series, "KV cache KiB per token at 1,024 tokens (16-bit)", "WikiText-2 perplexity",
                     "SmolLM2-135M: KV policies on converted models", logy=True, width=720)


def table(results: dict) -> str:
    """The markdown table of docs/kv-cache.md: every model × cache, bytes per token and perplexity."""
    names = {"original": "original", "gqa": "GQA 3 → 1 + uptrain", "latent": "latent 50% + uptrain",
             "pruned": "KV-head pruning 3 → 2 + uptrain"}
    arms = {"full": "full cache", "policy": "headwise policy", "streaming": "StreamingLLM"}
    base = results["arms"]["original"]["arms"]["full"]["kv_bytes_per_token_fp16"]
    rows = ["| model | cache | KV heads kept full | KV bytes/token at 1,024 (16-bit) | perplexity | × model's full cache |",
            "|---|---|---|---:|---:|---:|"]
    for kind, label in names.items():
        model = results["arms"].get(kind, {}).get("arms", {})
        for arm, arm_label in arms.items():
            if arm in model:
                r = model[arm]
                rows.append(f"| {label} | {arm_label} | {r['policy'].split(',')[0]} | "
                            f"{r['kv_bytes_per_token_fp16']:,} ({r['kv_bytes_per_token_fp16'] / base:.0%}) | "
                            f"{r['ppl']:.2f} | {r['ppl'] / model['full']['ppl']:.3f} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["build", "arms", "plot", "table"])
    parser.add_argument("kind", nargs="?", choices=["original", "gqa", "latent", "pruned"])
    parser.add_argument("--models", type=Path, default=Path("/tmp/headwise-kv-stacking"))
    common.add_data(parser, common.WIKITEXT, "WikiText-2 valid.txt")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--uptrain-tokens", type=int, default=2048)
    args = parser.parse_args()
    torch.manual_seed(0)
    results = common.load_results(args.out)
    if args.step == "table":
        print(table(results))
        return
    if args.step == "plot":
        common.write_doc("kv-stacking.svg", plot(results))
        return
    data = common.data_file(args.data, common.WIKITEXT)
    if args.step == "build":
        results.setdefault("builds", {})[args.kind] = build(args.kind, args.models, args.uptrain_tokens, data)
    else:
        results.setdefault("arms", {})[args.kind] = arms(args.kind, args.models, data)
    common.save_results(args.out, results)


if __name__ == "__main__":
    main()
