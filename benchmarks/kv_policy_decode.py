"""Decode speed, KV bytes and peak memory of SmolLM2-135M with the full cache vs per-head KV policies.

One fresh process per arm: greedy ``generate()`` of ``--new`` tokens after a ``--context``-token passkey prompt.
Reports prefill seconds, decode tokens/s (decode time = total − prefill, medians of ``--repeats``), the KV bytes the
cache holds at the end (``PolicyCache.stored_bytes``) and the peak RSS above the RSS before the first call
(``VmHWM``, reset just before). The policies come from experiments/kv_policy_results.json (run the experiment first).
Writes the ``kv-policy`` section of docs/benchmarks.md.

    python benchmarks/kv_policy_decode.py [--context 2048] [--new 64] [--repeats 3] [--threads 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("full", "policy", "streaming", "random")


def child(arm: str, context: int, new: int, repeats: int, threads: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sys.path.insert(0, str(ROOT / "experiments"))
    import kv_policy as experiment

    from headwise.kvcache import apply_kv_policy, passkey_prompts
    from headwise.models import resolve_model

    torch.set_num_threads(threads)
    path = resolve_model("smollm2-135m")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="headwise").eval()
    results = experiment.load(experiment.RESULTS)
    args = argparse.Namespace(budget=results["scores"]["budget"], length=results["scores"]["length"],
                              sink=results["scores"]["sink"], window=results["scores"]["window"])
    apply_kv_policy(model, experiment.policies(args, model, results)[arm])
    ids = passkey_prompts(tokenizer, context, [0.5], 1)[0].ids[None]
    mask = torch.ones_like(ids)

    def rss() -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * 4096

    with torch.no_grad():
        model.generate(ids[:, :64], attention_mask=mask[:, :64], max_new_tokens=2, do_sample=False)  # warm-up
        base = rss()
        Path("/proc/self/clear_refs").write_text("5")
        prefill, total, stored, seen = [], [], 0, 1
        for _ in range(repeats):
            start = time.perf_counter()
            model.generate(ids, attention_mask=mask, max_new_tokens=1, do_sample=False)
            prefill.append(time.perf_counter() - start)
            start = time.perf_counter()
            out = model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                 return_dict_in_generate=True)
            total.append(time.perf_counter() - start)
            stored, seen = out.past_key_values.stored_bytes(), out.past_key_values.get_seq_length()
    peak = next(int(l.split()[1]) * 1024 for l in Path("/proc/self/status").read_text().splitlines()
                if l.startswith("VmHWM"))
    decode = statistics.median(total) - statistics.median(prefill)
    return {"arm": arm, "prefill_s": statistics.median(prefill), "decode_tokens_per_s": (new - 1) / decode,
            "kv_bytes": stored, "kv_bytes_per_token": stored / seen, "peak_rss_above_start": peak - base}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.context, args.new, args.repeats, args.threads)))
        return
    rows = []
    for arm in ARMS:
        out = subprocess.run([sys.executable, __file__, "--child", arm, "--context", str(args.context), "--new",
                              str(args.new), "--repeats", str(args.repeats), "--threads", str(args.threads)],
                             check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    sys.path.insert(0, str(Path(__file__).parent))
    from common import machine, update_section

    lines = [f"SmolLM2-135M, fp32, {args.context}-token prompt + {args.new} greedy tokens, {machine()} "
             f"({args.threads} threads); `python benchmarks/kv_policy_decode.py`.", "",
             "| arm | KV MiB held | KV bytes/token | prefill s | decode tok/s | peak RSS above start MiB |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['arm']} | {r['kv_bytes'] / 2**20:.1f} | {r['kv_bytes_per_token']:.0f} | "
                     f"{r['prefill_s']:.2f} | {r['decode_tokens_per_s']:.1f} | "
                     f"{r['peak_rss_above_start'] / 2**20:.0f} |")
    update_section("kv-policy", "## Per-head KV cache (decode)\n\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
