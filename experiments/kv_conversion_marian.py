"""KV-cache conversion of the shared Multi30k Marian model's decoder self-attention (issue #22): grouped-query
merging 8 → 4, 2, 1 key/value heads (mean pooling vs calibrated) and latent keys/values at 50%, 25% and 12.5% of
the KV bytes;
sacreBLEU on test_2016_flickr (greedy), one-shot and after a short uptraining on train pairs.

Calibration: the input moments of the decoder self-attention on the first ``--calib-pairs`` val pairs (teacher
forced, ``Translation.calibration_inputs``); computed once, shared by every calibrated arm. Uptraining:
``Translation.finetune`` (every weight, label cross-entropy, ``HeadwiseTrainer``) for ``--steps`` steps of
``--batch`` train pairs; the same run on the unconverted model is the control.

    python experiments/kv_conversion_marian.py [--arms original,gqa4-mean,...] [--steps 40]
    python experiments/kv_conversion_marian.py --table       # the markdown table of docs/kv-cache.md
    python experiments/kv_conversion_marian.py --plot        # docs/kv-conversion-marian.svg
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import common
from headwise.conversion import convert_gqa, convert_latent, input_moments, kv_cache_bytes
from headwise.conversion.checks import convertible_sites
from headwise.models import load_model
from headwise.tasks import get_task
from headwise.training import finetune

RESULTS = common.EXPERIMENTS / "kv_conversion_marian.json"
MODEL = "multi30k-marian-de-en"
ARMS: dict[str, dict | None] = {
    "original": None,
    **{f"gqa{g}-{init}": dict(kind="gqa", kv_heads=g, init=init) for g in (4, 2, 1) for init in ("mean", "calibrated")},
    "latent50-calibrated": dict(kind="latent", kv_budget=0.5, init="calibrated"),
    "latent50-svd": dict(kind="latent", kv_budget=0.5, init="svd"),
    # rank 0.5·2·8·32 = 256 = d_model: a latent as wide as the input is exact, so smaller budgets are the test
    **{f"latent{b}-calibrated": dict(kind="latent", kv_budget=b / 100, init="calibrated") for b in (25, 12.5)},
}


def convert(model, arm: dict, moments: dict) -> None:
    calibrated = arm["init"] == "calibrated"
    if arm["kind"] == "gqa":
        convert_gqa(model, kv_heads=arm["kv_heads"], init=arm["init"], moments=moments if calibrated else None)
    else:
        convert_latent(model, kv_budget=arm["kv_budget"], init=arm["init"], moments=moments if calibrated else None)


def table(results: dict) -> str:
    base = results["arms"]["original"]
    rows = ["| arm | KV bytes/token (16-bit) | BLEU one-shot | BLEU uptrained |", "|---|---:|---:|---:|"]
    for name, r in results["arms"].items():
        up = r.get("uptrained", {}).get("bleu")
        rows.append(f"| {name} | {r['kv_bytes_per_token_fp16']:,} ({r['kv_bytes_per_token_fp16'] / base['kv_bytes_per_token_fp16']:.0%}) "
                    f"| {r['bleu']:.2f} | {'' if up is None else f'{up:.2f}'} |")
    return "\n".join(rows)


def plot(results: dict) -> str:
    """BLEU vs decoder KV bytes per token: grouped-query curves (8 → 4, 2, 1 KV heads) per init, one-shot and
    uptrained, latent points, the original (and its uptraining control)."""
    from headwise.report import svg

    arms = results["arms"]
    x = lambda r: r["kv_bytes_per_token_fp16"]  # noqa: E731

    def curve(names: list[str], uptrained: bool) -> tuple[list[float], list[float]]:
        rows = [arms[n] for n in names if n in arms and (not uptrained or "uptrained" in arms[n])]
        return [x(r) for r in rows], [r["uptrained"]["bleu"] if uptrained else r["bleu"] for r in rows]

    series = {}
    for init in ("mean", "calibrated"):
        names = ["original"] + [f"gqa{g}-{init}" for g in (4, 2, 1)]
        series[f"GQA {init}, one-shot"] = curve(names, False)
        series[f"GQA {init}, uptrained"] = curve(names, True)
    latent = ["original", "latent50-calibrated", "latent25-calibrated", "latent12.5-calibrated"]
    series["latent calibrated, one-shot"] = curve(latent, False)
    series["latent calibrated, uptrained"] = curve(latent, True)
    series["latent 50% svd, one-shot"] = curve(["latent50-svd"], False)
    return svg.lines({k: v for k, v in series.items() if v[0]}, "decoder self-attention KV bytes per token (16-bit)",
                     "BLEU (test_2016_flickr, greedy)", "Multi30k Marian: decoder KV-cache conversions", width=720)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--calib-pairs", type=int, default=512)
    parser.add_argument("--steps", type=int, default=40, help="uptraining steps (0: one-shot only)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--limit", type=int, default=None, help="evaluate the first N test sentences (quick looks)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--table", action="store_true")
    parser.add_argument("--plot", action="store_true", help="write docs/kv-conversion-marian.svg from --out")
    common.add_data(parser, "multi30k", "the Multi30k folder (the translation task's --data-dir)")
    common.add_device(parser)
    args = parser.parse_args()
    results = common.load_results(args.out)
    if args.table:
        print(table(results))
        return
    if args.plot:
        common.write_doc("kv-conversion-marian.svg", plot(results))
        return
    torch.manual_seed(0)
    task = get_task("translation", limit=args.limit, data_dir=None if args.data is None else str(args.data))
    model, tokenizer = load_model(MODEL, task=task, device=args.device)
    calibration = task.calibration_inputs(tokenizer, limit=args.calib_pairs)
    moments = input_moments(model, convertible_sites(model, "experiment"), calibration, progress=True)
    results["setup"] = {"model": MODEL, "evaluation": f"test_2016_flickr, greedy, {args.limit or 1000} sentences",
                        "calibration_pairs": args.calib_pairs, "uptrain": {"steps": args.steps, "batch": args.batch,
                                                                          "lr": args.lr, "data": "train split"}}
    for name in args.arms.split(","):
        arm = ARMS[name]
        model, _ = load_model(MODEL, task=task, device=args.device)
        start = time.time()
        if arm:
            convert(model, arm, moments)
        row = {**(arm or {}), "kv_bytes_per_token_fp16": kv_cache_bytes(model, 2),
               "convert_seconds": round(time.time() - start, 1), "bleu": task.evaluate(model, tokenizer)["bleu"]}
        if args.steps:
            start = time.time()
            finetune(model, tokenizer, task, max_steps=args.steps, batch_size=args.batch, learning_rate=args.lr,
                     progress=False)
            row["uptrained"] = {"steps": args.steps, "pairs": args.steps * args.batch,
                                "seconds": round(time.time() - start, 1),
                                "bleu": task.evaluate(model, tokenizer)["bleu"]}
        results.setdefault("arms", {}).setdefault(name, {}).update(row)  # a one-shot run keeps an earlier uptraining
        print(name, json.dumps(row), flush=True)
        common.save_results(args.out, results)


if __name__ == "__main__":
    main()
