"""Decode speed, KV bytes and peak memory of SmolLM2-135M with the full cache, per-head KV policies and KV-cache
conversions (grouped-query 3 → 1, latent at half the KV bytes), alone and with StreamingLLM stacked on them.

One fresh process per arm: greedy ``generate()`` of ``--new`` tokens after a ``--context``-token passkey prompt.
Reports prefill seconds, decode tokens/s (decode time = total − prefill, medians of ``--repeats``), the KV bytes the
cache holds at the end (``PolicyCache.stored_bytes``: every buffer of transformers' cache) and the peak RSS above
the RSS before the first call (``VmHWM``, reset just before). The policies come from
experiments/kv_policy_results.json (run the experiment first). The converted models are built once in the parent
(speed and memory do not depend on the fit, so the cheap inits are used: mean pooling, weight-space latent) and
reloaded in each child with ``headwise.from_pretrained``. A latent model's cache still holds the decoded keys and
values (transformers has no latent cache for it): its row shows the compute cost of decoding, not a memory saving.
Writes the ``kv-policy`` section of docs/benchmarks.md (not with ``--quick``).

    python benchmarks/kv_policy_decode.py [--context 2048] [--new 64] [--repeats 3] [--threads 2] [--device cpu]
    python benchmarks/kv_policy_decode.py --quick      # 128-token prompt, 4 new tokens, 1 repeat: checks it runs
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POLICY_ARMS = ("full", "policy", "policy-retrieval", "streaming", "random")
CONVERSIONS = {"gqa": "grouped-query 3 → 1 KV heads", "latent": "latent keys/values at half the KV bytes"}
ARMS = POLICY_ARMS + ("gqa", "gqa+streaming", "latent", "latent+streaming")


def build_conversions(folder: Path) -> None:
    """Save SmolLM2 converted to 1 KV head per layer and to latent keys/values at half the bytes under ``folder``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import headwise
    from headwise.conversion import convert_gqa, convert_latent
    from headwise.models import resolve_model

    path = resolve_model("smollm2-135m")
    for kind in CONVERSIONS:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        if kind == "gqa":
            convert_gqa(model, kv_heads=1, init="mean")
        else:
            convert_latent(model, kv_budget=0.5, init="svd")
        headwise.save_pretrained(model, folder / kind, tokenizer=AutoTokenizer.from_pretrained(path))


def load_arm(arm: str, conversions: Path, device: str, context: int, window: int | None):
    """The model of ``arm`` with its KV policy applied, and its tokenizer; policies are sized to half the full
    cache at ``context`` tokens, streaming heads keep sink 4 + ``window`` (default: the calibration's)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import headwise
    from headwise.kvcache import KVPolicy, apply_kv_policy, streaming
    from headwise.models import resolve_model

    sys.path.insert(0, str(ROOT / "experiments"))
    import kv_policy as experiment

    base, _, stacked = arm.partition("+")
    if base in CONVERSIONS:
        model = headwise.from_pretrained(conversions / base, device=device).eval()
        tokenizer = AutoTokenizer.from_pretrained(conversions / base)
        policy = KVPolicy.uniform(model, streaming(4, context // 2 - 4)) if stacked else KVPolicy.uniform(model)
    else:
        path = resolve_model("smollm2-135m")
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="headwise").to(device).eval()
        results = experiment.load(experiment.RESULTS)
        args = argparse.Namespace(budget=results["scores"]["budget"], length=context, size_at=context,
                                  sink=results["scores"]["sink"], window=window or results["scores"]["window"])
        policy = experiment.policies(args, model, results)[arm]
    apply_kv_policy(model, policy)
    return model, tokenizer


def child(arm: str, context: int, new: int, repeats: int, threads: int, conversions: Path, device: str,
          window: int | None) -> dict:
    import torch

    from headwise.compat import CACHE
    from headwise.kvcache import passkey_prompts

    torch.set_num_threads(threads)
    model, tokenizer = load_arm(arm, conversions, device, context, window)
    ids = passkey_prompts(tokenizer, context, [0.5], 1)[0].ids[None].to(device)
    mask = torch.ones_like(ids)
    cuda = torch.device(device).type == "cuda"

    def rss() -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * 4096

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    with torch.no_grad():
        model.generate(ids[:, :64], attention_mask=mask[:, :64], max_new_tokens=2, do_sample=False)  # warm-up
        base = torch.cuda.memory_allocated() if cuda else rss()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        else:
            Path("/proc/self/clear_refs").write_text("5")
        prefill, total, stored, seen = [], [], 0, 1
        for _ in range(repeats):
            sync()
            start = time.perf_counter()
            model.generate(ids, attention_mask=mask, max_new_tokens=1, do_sample=False)
            sync()
            prefill.append(time.perf_counter() - start)
            start = time.perf_counter()
            out = model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                 return_dict_in_generate=True)
            sync()
            total.append(time.perf_counter() - start)
            stored, seen = out[CACHE].stored_bytes(), out[CACHE].get_seq_length()
    if cuda:
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = next(int(l.split()[1]) * 1024 for l in Path("/proc/self/status").read_text().splitlines()
                    if l.startswith("VmHWM"))
    decode = max(statistics.median(total) - statistics.median(prefill), 1e-9)
    return {"arm": arm, "prefill_s": statistics.median(prefill), "decode_tokens_per_s": (new - 1) / decode,
            "kv_bytes": stored, "kv_bytes_per_token": stored / seen, "peak_memory_above_start": peak - base,
            "memory": "CUDA allocated" if cuda else "RSS"}


def table(rows: list[dict], args: argparse.Namespace) -> str:
    from common import machine

    lines = [f"SmolLM2-135M, fp32, {args.context}-token prompt + {args.new} greedy tokens, {machine()} "
             f"({args.threads} threads, {args.device}); `python benchmarks/kv_policy_decode.py`. Conversions: "
             "gqa = 3 → 1 KV heads, latent = half the KV values per token (its cache still holds decoded keys and "
             f"values); `streaming` and `+streaming` = sink 4 + window {args.context // 2 - 4} on every head; `policy` "
             f"(`combined` ranking), `policy-retrieval` and `random` = as many full heads as fit half the full cache "
             f"at {args.context} tokens next to sink 4 + window {args.window or 124} on the others.", "",
             f"| arm | KV MiB held | KV bytes/token | prefill s | decode tok/s | peak {rows[0]['memory']} above start MiB |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['arm']} | {r['kv_bytes'] / 2**20:.1f} | {r['kv_bytes_per_token']:.0f} | "
                     f"{r['prefill_s']:.2f} | {r['decode_tokens_per_s']:.1f} | "
                     f"{r['peak_memory_above_start'] / 2**20:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (peak memory: RSS on cpu, allocated on cuda)")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--window", type=int, default=None,
                        help="streaming heads' window in the policy arms (default: the calibration's, 124; the "
                             "`combined` ranking exists only there, so pass --arms without `policy` otherwise)")
    parser.add_argument("--quick", action="store_true", help="a 128-token prompt, 4 new tokens, one repeat, "
                                                             "one thread; prints, does not write the docs")
    parser.add_argument("--conversions", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.context, args.new, args.repeats, args.threads = 128, 4, 1, 1
    if args.child:
        print(json.dumps(child(args.child, args.context, args.new, args.repeats, args.threads, args.conversions,
                               args.device, args.window)))
        return
    arms = args.arms.split(",")
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        parser.error(f"unknown arms {unknown}; choose from {', '.join(ARMS)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="headwise-kv-bench-") as tmp:
        if any(a.partition("+")[0] in CONVERSIONS for a in arms):
            build_conversions(Path(tmp))
        for arm in arms:
            done = subprocess.run([sys.executable, __file__, "--child", arm, "--context", str(args.context),
                                   "--new", str(args.new), "--repeats", str(args.repeats), "--threads",
                                   str(args.threads), "--device", args.device, "--conversions", tmp]
                                  + (["--window", str(args.window)] if args.window else []),
                                  capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"arm {arm} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(rows[-1], flush=True)
    sys.path.insert(0, str(Path(__file__).parent))
    text = table(rows, args)
    print(text)
    if not args.quick:
        from common import update_section

        update_section("kv-policy", "## Per-head KV cache and KV-cache conversions (decode)\n\n" + text)


if __name__ == "__main__":
    main()
