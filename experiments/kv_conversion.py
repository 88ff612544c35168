"""KV-cache conversion of SmolLM2-135M on WikiText-2: perplexity of grouped-query (3 → 1 key/value heads) and
latent (half the KV bytes) conversions, one-shot, against the original.

Split: calibration on the first 90% of the lines of valid.txt (its first ``--calib-tokens`` tokens, in 1,024-token
windows), evaluation on the first 4,096 tokens of the last 10% of the lines in 1,024-token windows (the issue's
baseline used the first 4,096 tokens of the whole file, which lie inside the calibration part; we do not).

    python experiments/kv_conversion.py --out experiments/kv_conversion.json [--arms original,gqa-mean,...]
        [--data FILE] [--device cuda]
    python experiments/kv_conversion.py --plot     # docs/kv-conversion.svg from the JSON

Input moments are computed once and cached (``--moments-cache``). Arms ending in ``+uptrain`` train every weight
on ``--uptrain-tokens`` tokens of the calibration part (next-token loss, ``HeadwiseTrainer``) after converting.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import common
from headwise.conversion import convert_gqa, convert_latent, input_moments, kv_cache_bytes
from headwise.conversion.checks import convertible_sites
from headwise.models import resolve_model

RESULTS = common.EXPERIMENTS / "kv_conversion.json"
WINDOW = 1024
ARMS = {
    "original": None,
    "gqa-mean": dict(kind="gqa", init="mean"),
    "gqa-svd": dict(kind="gqa", init="svd"),
    "gqa-calibrated": dict(kind="gqa", init="calibrated"),
    "gqa-calibrated-similarity": dict(kind="gqa", init="calibrated", grouping="similarity"),
    "latent-50-svd": dict(kind="latent", init="svd"),
    "latent-50-calibrated": dict(kind="latent", init="calibrated"),
    "latent-50-calibrated-rope8": dict(kind="latent", init="calibrated", rope_pairs=8),
    "gqa-calibrated+uptrain": dict(kind="gqa", init="calibrated", uptrain=True),
    "latent-50-calibrated+uptrain": dict(kind="latent", init="calibrated", uptrain=True),
}


def split_tokens(tokenizer, data: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids of the first 90% of the lines of ``data`` (calibration) and of the last 10% (evaluation)."""
    lines = data.read_text(encoding="utf-8").splitlines(keepends=True)
    cut = int(len(lines) * 0.9)
    encode = lambda part: torch.tensor(tokenizer("".join(part))["input_ids"])  # noqa: E731
    return encode(lines[:cut]), encode(lines[cut:])


def windows(ids: torch.Tensor, tokens: int, window: int = WINDOW) -> list[torch.Tensor]:
    """``[1, window]`` slices of the first ``tokens`` ids."""
    ids = ids[:tokens]
    return [ids[i : i + window][None] for i in range(0, len(ids) - window + 1, window)]


@torch.no_grad()
def perplexity(model, batches: list[torch.Tensor]) -> float:
    """exp of the mean next-token loss over every predicted token of every window."""
    total, count = 0.0, 0
    for ids in batches:
        ids = ids.to(model.device)
        logits = model(input_ids=ids).logits[:, :-1].float()
        total += float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="sum"))
        count += ids.shape[1] - 1
    return math.exp(total / count)


def moments_of(path: str, calibration: list[torch.Tensor], cache: Path,
               device: str = "cpu") -> dict[str, torch.Tensor]:
    """Input moments of the original model's decoder sites (computed once, then read from ``cache``)."""
    if cache.is_file():
        return torch.load(cache)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
    moments = input_moments(model, convertible_sites(model, "experiment"), calibration, progress=True)
    torch.save(moments, cache)
    return moments


def uptrain(model, ids: torch.Tensor, window: int, lr: float) -> dict:
    """One epoch of next-token training on ``ids`` cut in ``window``-token sequences (batch 1)."""
    from transformers import TrainingArguments

    from headwise.training import HeadwiseTrainer

    data = [{"input_ids": w[0], "labels": w[0]} for w in windows(ids, len(ids), window)]
    args = TrainingArguments(output_dir="/tmp/headwise-kv-uptrain", per_device_train_batch_size=1, learning_rate=lr,
                             num_train_epochs=1, lr_scheduler_type="constant", logging_steps=1, save_strategy="no",
                             report_to=[], use_cpu=model.device.type == "cpu", seed=0)
    model.train()
    wall, cpu = time.time(), time.process_time()
    result = HeadwiseTrainer(model=model, args=args, train_dataset=data).train()
    model.eval()
    return {"uptrain_tokens": sum(d["input_ids"].numel() for d in data), "uptrain_steps": result.global_step,
            "uptrain_wall_seconds": round(time.time() - wall), "uptrain_cpu_seconds": round(time.process_time() - cpu),
            "torch_threads": torch.get_num_threads(),
            "uptrain_loss": result.training_loss, "uptrain_lr": lr, "uptrain_window": window}


def table(results: dict) -> str:
    """The results as a markdown table (for docs/kv-cache.md)."""
    base = results["original"]
    rows = ["| arm | KV bytes/token (16-bit) | perplexity | × original |", "|---|---:|---:|---:|"]
    for name, r in results.items():
        if name == "setup":
            continue
        rows.append(f"| {name} | {r['kv_bytes_per_token_fp16']:,} ({r['kv_bytes_per_token_fp16'] / base['kv_bytes_per_token_fp16']:.0%}) "
                    f"| {r['perplexity']:,.2f} | {r['perplexity'] / base['perplexity']:,.2f} |")
    return "\n".join(rows)


def plot(results: dict) -> str:
    """Perplexity (log) vs KV bytes per token: one line per method and init, from one-shot through uptraining."""
    from headwise.report import svg

    def path(prefix: str) -> tuple[list[float], list[float]]:
        names = [prefix] + sorted((n for n in results if n.startswith(prefix + "+uptrain@") and "-lr" not in n),
                                  key=lambda n: int(n.split("@")[1]))
        rows = [results[n] for n in names if n in results]
        return [r["kv_bytes_per_token_fp16"] / 1024 for r in rows], [r["perplexity"] for r in rows]

    series = {"original": path("original"), "GQA 3→1 mean pooling": path("gqa-mean"),
              "GQA 3→1 weight-space (svd)": path("gqa-svd"),
              "GQA 3→1 calibrated: one-shot → uptrained": path("gqa-calibrated"),
              "latent 50% svd": path("latent-50-svd"), "latent 50% calibrated + rope8": path("latent-50-calibrated-rope8"),
              "latent 50% calibrated: one-shot → uptrained": path("latent-50-calibrated")}
    return svg.lines({k: v for k, v in series.items() if v[0]}, "KV cache KiB per token (16-bit)",
                     "WikiText-2 perplexity (log)", "SmolLM2-135M: KV-cache conversions", logy=True, width=720)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--calib-tokens", type=int, default=16384)
    parser.add_argument("--eval-tokens", type=int, default=4096)
    parser.add_argument("--kv-budget", type=float, default=0.5)
    parser.add_argument("--uptrain-tokens", type=int, default=4096)
    parser.add_argument("--uptrain-window", type=int, default=256)
    parser.add_argument("--uptrain-lr", type=float, default=1e-4)
    parser.add_argument("--moments-cache", default="/tmp/headwise-kv-moments.pt")
    parser.add_argument("--out", default=str(RESULTS))
    common.add_data(parser, common.WIKITEXT, "WikiText-2 valid.txt (first 90% of lines calibrate, last 10% evaluate)")
    common.add_device(parser)
    parser.add_argument("--table", action="store_true", help="print the results in --out as a markdown table")
    parser.add_argument("--plot", action="store_true", help="write docs/kv-conversion.svg from the results in --out")
    args = parser.parse_args()
    if args.table:
        print(table(common.load_results(args.out)))
        return
    if args.plot:
        common.write_doc("kv-conversion.svg", plot(common.load_results(args.out)))
        return
    torch.manual_seed(0)
    data = common.data_file(args.data, common.WIKITEXT)
    path = resolve_model("smollm2-135m")
    tokenizer = AutoTokenizer.from_pretrained(path)
    calib_ids, eval_ids = split_tokens(tokenizer, data)
    calibration, evaluation = windows(calib_ids, args.calib_tokens), windows(eval_ids, args.eval_tokens)
    out = Path(args.out)
    results = common.load_results(out)
    results["setup"] = {"model": "smollm2-135m", "data": str(data), "window": WINDOW,
                        "calibration_tokens": sum(b.numel() for b in calibration),
                        "evaluation_tokens": sum(b.numel() for b in evaluation),
                        "split": "calibration: first 90% of lines; evaluation: first tokens of the last 10%"}
    for name in args.arms.split(","):
        arm = ARMS[name]
        moments = moments_of(path, calibration, Path(args.moments_cache), args.device) \
            if arm and arm["init"] == "calibrated" else None
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(args.device).eval()
        start = time.time()
        if arm and arm["kind"] == "gqa":
            convert_gqa(model, kv_heads=1, grouping=arm.get("grouping", "contiguous"), init=arm["init"], moments=moments)
        elif arm:
            convert_latent(model, kv_budget=args.kv_budget, rope_pairs=arm.get("rope_pairs", 0), init=arm["init"],
                           moments=moments)
        fit_s = time.time() - start
        extra = uptrain(model, calib_ids[: args.uptrain_tokens], args.uptrain_window, args.uptrain_lr) \
            if arm and arm.get("uptrain") else {}
        ppl = perplexity(model, evaluation)
        if extra:
            name = f"{name}@{extra['uptrain_tokens']}" + (f"-lr{args.uptrain_lr:g}" if args.uptrain_lr != 1e-4 else "")
        results[name] = {"perplexity": ppl, "kv_bytes_per_token_fp16": kv_cache_bytes(model, 2),
                         "fit_seconds_without_calibration": round(fit_s, 1), **(arm or {}), **extra}
        print(name, json.dumps(results[name]), flush=True)
        common.save_results(out, results)


if __name__ == "__main__":
    main()
