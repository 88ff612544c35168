"""The per-head KV cache in the running process: decode tokens/s, prefill time, peak memory and KV bytes held by
plain ``model.generate()`` under the default policy at half the full cache's bytes, beside the full cache.

Rows: SmolLM2-135M-Instruct (fp32) at 2k tokens batch 1, 8k batch 1, 2k batch 4 (left-padded prompts of 2048, 2000,
1950 and 1900 tokens), and a random-initialised model with Llama-3.2-1B's shapes (16 layers, 32 query / 8 KV heads,
head dim 64, hidden 2048, intermediate 8192, vocab 128256, tied embeddings; ``--big-dtype``, bf16 by default so it
fits 5 GiB) at 8k batch 1. Prompts are seeded random token ids (speed and memory do not depend on the text).

Policies: SmolLM2 gets ``headwise.kv_policy(model, tokenizer, kv_budget=0.5, context=C)`` — the default (its ranking
on its calibration prompts, ``retrieval`` when the recorded rows ran, ``retrieval+lookup`` since; sink 4, the window
of the time, as many full heads as fit half the bytes at
``C``); the random model the same count of full heads per the budget, picked by ``ranking="random"`` (its weights
carry no retrieval signal). The policy arm uses its default ``prefill_chunk`` (``PREFILL_CHUNK``); the full cache
is transformers' default (one prefill forward).

Memory: each (row, arm) in a fresh process: load, a short warm-up ``generate``, one greedy ``generate()`` of
``--new`` tokens; peak = ``VmHWM`` (reset just before) minus the RSS after loading and warm-up, i.e. above the loaded
weights; KV bytes held = every buffer of the cache at the end (``PolicyCache.stored_bytes``; the full cache's keys
and values). Speed: one more process per row alternates full and policy calls (``--repeats`` each; the 1B row takes
the memory processes' single calls instead). Prefill time = until the first token's logits (a logits processor
stamps it), decode tokens/s = the batch's other ``new − 1`` tokens per row over the rest; medians.

    python benchmarks/kv_policy_decode.py                # every row, 3 repeats (1 for the 1B row), 32 new tokens
    python benchmarks/kv_policy_decode.py --quick        # < 2 min: SmolLM2 at 512 tokens batch 1 and 2, 8 new tokens
    python benchmarks/kv_policy_decode.py --rows smollm2-2k --note "under load"
    python benchmarks/kv_policy_decode.py --rows llama1b-8k --context 512 --new 3   # a short check of the 1B row

Writes benchmarks/results/kv_policy_decode_cpu.json and .md (``--quick``: ..._quick.json/.md).
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
RESULTS = ROOT / "benchmarks" / "results"
ROWS = {  # name: (model, context, batch)
    "smollm2-2k": ("smollm2-135m", 2048, 1),
    "smollm2-8k": ("smollm2-135m", 8192, 1),
    "smollm2-2k-b4": ("smollm2-135m", 2048, 4),
    "llama1b-8k": ("llama-1b-random", 8192, 1),
}
QUICK_ROWS = {"smollm2-512": ("smollm2-135m", 512, 1), "smollm2-512-b2": ("smollm2-135m", 512, 2)}
TARGETS = {  # the table: decode ≥, prefill ≤, peak ≤, KV ≤ (ratios policy / full)
    "smollm2-2k": (1.0, 1.1, 0.9, 0.52), "smollm2-8k": (1.3, 1.1, 0.7, 0.52), "smollm2-2k-b4": (1.1, 1.1, 0.8, 0.52),
}
BATCH_TRIM = 48  # row b of a batch is `context - b · BATCH_TRIM` tokens (left-padded), 2048, 2000, 1952, 1904 at 2k


def big_config():
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                       num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True,
                       max_position_embeddings=131072, rope_theta=500000.0)


def load(model_name: str, dtype: str):
    """The model (eval, headwise attention) and its vocabulary size."""
    import torch
    from transformers import AutoModelForCausalLM

    if model_name == "llama-1b-random":
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(big_config(), attn_implementation="headwise",
                                                 dtype=getattr(torch, dtype))
    else:
        from headwise.models import resolve_model

        model = AutoModelForCausalLM.from_pretrained(resolve_model(model_name), attn_implementation="headwise",
                                                     dtype=getattr(torch, dtype))
    return model.eval()


def build_policy(model_name: str, context: int, out: Path) -> dict:
    """Write the policy arm's ``policy.json`` for ``model_name`` at ``context`` tokens; returns what it is."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import headwise

    if model_name == "llama-1b-random":
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(big_config())
        policy, _ = headwise.kv_policy(model, None, kv_budget=0.5, context=context, ranking="random")
        how = "random ranking, as many full heads as fit half the bytes"
    else:
        from headwise.models import resolve_model

        path = resolve_model(model_name)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        policy, _ = headwise.kv_policy(model, AutoTokenizer.from_pretrained(path), kv_budget=0.5, context=context,
                                       progress=False)
        how = "headwise.kv_policy default (retrieval ranking)"
    policy.save(out)
    return {"policy": policy.describe(), "chosen_by": how, "kv_fraction": policy.kv_fraction(context)}


def prompts(vocab: int, context: int, batch: int):
    """Seeded random ids ``[batch, context]``, row ``b`` left-padded by ``b · BATCH_TRIM``, and the mask."""
    import torch

    g = torch.Generator().manual_seed(context + batch)
    ids = torch.randint(100, min(vocab, 30000), (batch, context), generator=g)
    mask = torch.ones_like(ids)
    for row in range(1, batch):
        ids[row, : row * BATCH_TRIM] = 0
        mask[row, : row * BATCH_TRIM] = 0
    return ids, mask


class Stamp:
    """A logits processor that records when each step's logits arrive (the first: right after the prefill)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids, scores):
        self.times.append(time.perf_counter())
        return scores


def timed_generate(model, ids, mask, new: int) -> tuple[float, float, object]:
    """One greedy ``generate()``: (prefill seconds, decode tokens/s over the batch, its output)."""
    from transformers import LogitsProcessorList

    stamp = Stamp()
    start = time.perf_counter()
    out = model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                         pad_token_id=0, return_dict_in_generate=True, logits_processor=LogitsProcessorList([stamp]))
    end = time.perf_counter()
    return stamp.times[0] - start, ids.shape[0] * (new - 1) / (end - stamp.times[0]), out


def child(args: argparse.Namespace) -> dict:
    """``--arm full|policy``: peak memory and KV bytes of one arm (fresh process); ``--arm both``: speed of the two
    arms in one process, alternating full and policy calls so that machine noise hits both alike."""
    import torch

    import headwise
    from headwise.compat import CACHE
    from headwise.kvcache import KVPolicy
    from headwise.kvcache.generation import PREFILL_CHUNK

    torch.set_num_threads(args.threads)
    model_name, context, batch = (ROWS | QUICK_ROWS)[args.row]
    context = args.child_context or context
    model = load(model_name, args.dtype)
    policy = KVPolicy.load(args.policy)
    ids, mask = prompts(model.config.vocab_size, context, batch)

    def use(arm: str) -> None:
        if arm.startswith("policy"):  # "policy" (the default chunk) or "policy@N" (N tokens, 0: the whole prompt)
            chunk = int(arm.partition("@")[2] or 0) or None if "@" in arm else PREFILL_CHUNK
            headwise.apply_kv_policy(model, policy, prefill_chunk=chunk)
        elif headwise.kvcache.policy_of(model) is not None:
            headwise.remove_kv_policy(model)

    def rss() -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * 4096

    arms = ("full", "policy") if args.arm == "both" else tuple(args.arm.split(",")) if "," in args.arm else (args.arm,)
    with torch.no_grad():
        for arm in arms:
            use(arm)
            model.generate(ids[:, -64:], attention_mask=mask[:, -64:], max_new_tokens=2, do_sample=False,
                           pad_token_id=0)
        if len(arms) > 1:
            times = {arm: {"prefill": [], "decode": []} for arm in arms}
            for _ in range(args.repeats):
                for arm in arms:
                    use(arm)
                    prefill, decode, _ = timed_generate(model, ids, mask, args.new)
                    times[arm]["prefill"].append(prefill)
                    times[arm]["decode"].append(decode)
            return {arm: {"prefill_s": statistics.median(t["prefill"]), "prefill_all": t["prefill"],
                          "decode_tokens_per_s": statistics.median(t["decode"]), "decode_all": t["decode"]}
                    for arm, t in times.items()}
        base = rss()
        Path("/proc/self/clear_refs").write_text("5")
        prefill, decode, out = timed_generate(model, ids, mask, args.new)
        cache = out[CACHE]
        stored = cache.stored_bytes() if hasattr(cache, "stored_bytes") else sum(
            t.untyped_storage().nbytes() for layer in cache.layers for t in (layer.keys, layer.values))
        seen = cache.get_seq_length()
    peak = next(int(line.split()[1]) * 1024 for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith("VmHWM"))
    return {"kv_bytes": stored, "tokens": seen, "peak_above_weights": peak - base, "weights_rss": base,
            "prefill_s_fresh": prefill, "decode_tokens_per_s_fresh": decode}


def ratios(full: dict, policy: dict) -> dict:
    return {"decode": policy["decode_tokens_per_s"] / full["decode_tokens_per_s"],
            "prefill": policy["prefill_s"] / full["prefill_s"],
            "peak": policy["peak_above_weights"] / max(full["peak_above_weights"], 1),
            "kv": policy["kv_bytes"] / full["kv_bytes"]}


def table(result: dict) -> str:
    lines = [f"{result['setup']}", "",
             "| row | policy | decode tok/s full → policy (×) | prefill s full → policy (×) | peak MiB above "
             "weights full → policy (×) | KV MiB held full → policy (×) | targets (decode ≥, prefill ≤, peak ≤, "
             "KV ≤) |",
             "|---|---|---|---|---|---|---|"]
    for name, row in result["rows"].items():
        f, p, r = row["full"], row["policy"], row["ratios"]
        target = row.get("targets")
        met = "—" if target is None else " ".join(
            ("✓" if ok else "✗") + f"{bound}" for ok, bound in zip(
                (r["decode"] >= target[0], r["prefill"] <= target[1], r["peak"] <= target[2], r["kv"] <= target[3]),
                target))
        lines.append(f"| {name} | {row['policy_info']['policy']} | {f['decode_tokens_per_s']:.1f} → "
                     f"{p['decode_tokens_per_s']:.1f} ({r['decode']:.2f}×) | {f['prefill_s']:.2f} → "
                     f"{p['prefill_s']:.2f} ({r['prefill']:.2f}×) | {f['peak_above_weights'] / 2**20:.0f} → "
                     f"{p['peak_above_weights'] / 2**20:.0f} ({r['peak']:.2f}×) | {f['kv_bytes'] / 2**20:.1f} → "
                     f"{p['kv_bytes'] / 2**20:.1f} ({r['kv']:.3f}×) | {met} |")
    return "\n".join(lines)


def run_child(args: argparse.Namespace, row: str, arm: str, path: Path, dtype: str, new: int, repeats: int) -> dict:
    context = [] if args.context is None else ["--child-context", str(args.context)]
    done = subprocess.run([sys.executable, __file__, "--child", "--row", row, "--arm", arm, "--policy", str(path),
                           "--dtype", dtype, "--new", str(new), "--repeats", str(repeats), "--threads",
                           str(args.threads), *context], capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{row} / {arm} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def chunk_sweep(args: argparse.Namespace, rows: dict) -> None:
    """Prefill time (alternating in one process, 2 new tokens) and peak memory (fresh processes) of the policy arm
    and the full cache at each ``--chunks`` value; writes benchmarks/results/kv_policy_prefill_chunk_cpu.json."""
    from headwise.io import atomic_write_text

    chunks = [int(c) for c in args.chunks.split(",")]
    arms = ["full"] + [f"policy@{c}" for c in chunks]
    result = {"setup": f"prefill of the policy arm per prefill_chunk (0: whole prompt), {args.threads} threads, CPU, "
                       f"time: medians of {args.repeats} alternating calls in one process; memory: fresh processes. "
                       f"{args.note}".strip(), "rows": {}}
    with tempfile.TemporaryDirectory(prefix="headwise-kv-chunks-") as tmp:
        for name, (model_name, context, _) in rows.items():
            path = Path(tmp) / f"{name}.json"
            info = build_policy(model_name, context, path)
            dtype = args.big_dtype if model_name == "llama-1b-random" else "float32"
            memory = {arm: run_child(args, name, arm, path, dtype, 2, 1) for arm in arms}
            speed = run_child(args, name, ",".join(arms), path, dtype, 2, args.repeats)
            result["rows"][name] = {"policy_info": info, "arms": {
                arm: {"prefill_s": speed[arm]["prefill_s"], "prefill_all": speed[arm]["prefill_all"],
                      "peak_above_weights": memory[arm]["peak_above_weights"]} for arm in arms}}
            for arm in arms:
                print(name, arm, f"prefill {speed[arm]['prefill_s']:.2f}s",
                      f"peak {memory[arm]['peak_above_weights'] / 2**20:.0f} MiB", flush=True)
    atomic_write_text(RESULTS / "kv_policy_prefill_chunk_cpu.json", json.dumps(result, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, from {', '.join(ROWS)}")
    parser.add_argument("--new", type=int, default=32, help="tokens generated per call")
    parser.add_argument("--repeats", type=int, default=3, help="generate() calls per arm (the 1B row: 1)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--big-dtype", default="bfloat16", help="dtype of the random 1B model (SmolLM2: float32)")
    parser.add_argument("--quick", action="store_true", help="SmolLM2 at 512 tokens, batch 1 and 2, 8 new tokens")
    parser.add_argument("--note", default="", help="written with the results, e.g. 'under load'")
    parser.add_argument("--context", type=int, default=None,
                        help="a shorter check of the chosen rows: this many prompt tokens instead of the row's own "
                             "(results go to ..._context<N>.json/.md), e.g. --rows llama1b-8k --context 512 --new 3")
    parser.add_argument("--chunks", default=None,
                        help="instead of the table: prefill time and peak memory of the policy arm at these "
                             "prefill_chunk values (0: the whole prompt), e.g. 256,512,1024,2048,0 --rows smollm2-8k")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-context", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--row", help=argparse.SUPPRESS)
    parser.add_argument("--arm", help=argparse.SUPPRESS)
    parser.add_argument("--policy", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    rows = dict(QUICK_ROWS) if args.quick else {}
    if not args.quick:
        unknown = sorted(set(args.rows.split(",")) - set(ROWS))
        if unknown:
            parser.error(f"unknown rows {unknown}; choose from {', '.join(ROWS)}")
        rows = {name: ROWS[name] for name in args.rows.split(",")}
    if args.context is not None:
        if args.context < 64:
            parser.error(f"--context {args.context}: give at least 64 tokens (the warm-up reads the last 64)")
        rows = {name: (model, args.context, batch) for name, (model, _, batch) in rows.items()}
    new = 8 if args.quick else args.new
    from headwise.kvcache.generation import PREFILL_CHUNK

    result = {"setup": (f"{'--quick: ' if args.quick else ''}{new} greedy tokens per generate(), {args.threads} "
                        f"threads, CPU, peak memory and KV bytes from one fresh process per (row, arm), "
                        f"speed from full and policy calls alternating in one process, medians of "
                        f"{3 if args.quick else args.repeats} (llama1b: one call per fresh process); policy arm "
                        f"with prefill_chunk={PREFILL_CHUNK}. {args.note}").strip(),
              "note": args.note, "rows": {}}
    if args.chunks:
        return chunk_sweep(args, rows)
    with tempfile.TemporaryDirectory(prefix="headwise-kv-bench-") as tmp:
        policies: dict[tuple[str, int], tuple[Path, dict]] = {}
        for name, (model_name, context, _) in rows.items():
            key = (model_name, context)
            if key not in policies:
                path = Path(tmp) / f"{model_name}-{context}.json"
                policies[key] = (path, build_policy(model_name, context, path))
            path, info = policies[key]
            dtype = args.big_dtype if model_name == "llama-1b-random" else "float32"
            repeats = 3 if args.quick else 1 if model_name == "llama-1b-random" else args.repeats

            def run(arm: str, repeats: int) -> dict:
                return run_child(args, name, arm, path, dtype, new, repeats)

            arms = {arm: run(arm, 1) for arm in ("full", "policy")}  # memory: a fresh process each
            if repeats > 1:  # speed: both arms alternating in one process
                for arm, speed in run("both", repeats).items():
                    arms[arm].update(speed)
            else:  # one call each: the fresh processes' timings
                for arm in arms.values():
                    arm.update(prefill_s=arm["prefill_s_fresh"], decode_tokens_per_s=arm["decode_tokens_per_s_fresh"])
            for arm, values in arms.items():
                print(name, arm, {k: v for k, v in values.items() if not k.endswith("_all")}, flush=True)
            result["rows"][name] = {"model": model_name, "context": context, "batch": rows[name][2], "dtype": dtype,
                                    "policy_info": info, **arms, "ratios": ratios(arms["full"], arms["policy"]),
                                    "targets": TARGETS.get(name) if args.context is None else None}
    from headwise.io import atomic_write_text

    stem = "kv_policy_decode_cpu" + ("_quick" if args.quick else "") + (
        "" if args.context is None else f"_context{args.context}")
    text = table(result)
    atomic_write_text(RESULTS / f"{stem}.json", json.dumps(result, indent=1))
    atomic_write_text(RESULTS / f"{stem}.md", text + "\n")
    print(text)


if __name__ == "__main__":
    main()
