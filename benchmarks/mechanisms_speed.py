"""Efficient attention vs. SDPA: forward and forward+backward latency and peak memory, sequence 512 → 16384.

Standalone modules (``build_attention``: q/k/v/o projections included), embed dim 512, 8 heads, batch 1, fp32 on
the CPU by default (``--device cuda --dtype float16`` for a GPU; CUDA timings synchronise around every call).
Times are interleaved medians (all mechanisms of one length and mode in one round-robin); ratios are to softmax
(SDPA) in the same run, causal mechanisms to causal SDPA. Peak memory is measured in a fresh process per
(mechanism, length): peak RSS (``VmHWM``, reset just before the call) above the RSS before it. ``ru_maxrss`` would
not do: Linux carries it across ``exec``, so a child started by a big parent reports the parent's peak. Writes the
``mechanisms`` section of docs/benchmarks.md.

    python benchmarks/mechanisms_speed.py [--sizes 512,1024,...] [--memory-sizes 2048,8192]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys

import torch
from common import interleaved, machine, median, update_section

from headwise.mechanisms import build_attention

DIM, HEADS = 512, 8
CONFIGS = {  # label -> (mechanism, causal, args)
    "softmax (SDPA)": ("softmax", False, {}),
    "local w=128": ("local", False, {"window": 128}),
    "local block w=128": ("local", False, {"window": 128, "mode": "block"}),
    "performer m=64": ("performer", False, {"features": 64}),
    "rfa m=64": ("rfa", False, {"features": 64}),
    "linear": ("linear", False, {}),
    "linear dpfp ν=1": ("linear", False, {"feature_map": "dpfp"}),
    "cosformer": ("cosformer", False, {}),
    "nystrom m=64": ("nystrom", False, {"landmarks": 64}),
    "lara C=64": ("lara", False, {"num_landmarks": 64}),
    "eva w=128 C=64": ("eva", False, {"window": 128, "num_chunks": 64}),
    "eva-paper w=128 C=64": ("eva-paper", False, {"window": 128, "num_landmarks": 64}),
    "scatterbrain w=64 m=64": ("scatterbrain", False, {"window": 64, "features": 64}),
    "scatterbrain sliding w=64 m=64": ("scatterbrain", False, {"window": 64, "features": 64, "mode": "sliding"}),
    "causal softmax (SDPA)": ("softmax", True, {}),
    "causal local w=128": ("local", True, {"window": 128}),
    "causal local block w=128": ("local", True, {"window": 128, "mode": "block"}),
    "causal performer m=64": ("performer", True, {"features": 64}),
    "causal scatterbrain w=64 m=64": ("scatterbrain", True, {"window": 64, "features": 64}),
    "causal eva w=128 c=8": ("eva", True, {"window": 128, "chunk_size": 8}),
    "causal eva w=128 C=64": ("eva", True, {"window": 128, "num_chunks": 64}),
    "causal eva-paper w=128 c=8": ("eva-paper", True, {"window": 128, "chunk_size": 8}),
}
DEVICE, DTYPE = torch.device("cpu"), torch.float32  # set by --device / --dtype


def module(label: str) -> torch.nn.Module:
    name, causal, args = CONFIGS[label]
    torch.manual_seed(0)
    return build_attention(name, dim=DIM, num_heads=HEADS, causal=causal, **args).to(DEVICE, DTYPE)


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def forward(m: torch.nn.Module, x: torch.Tensor):
    def run():
        with torch.no_grad():
            m(x)
        sync()
    return run


def forward_backward(m: torch.nn.Module, x: torch.Tensor):
    def run():
        xg = x.detach().requires_grad_()
        m(xg).sum().backward()
        m.zero_grad(set_to_none=True)
        sync()
    return run


def repeats_for(n: int) -> tuple[int, int]:
    """(repeats, warmup): fewer at the largest lengths (SDPA forward+backward at 16384 takes tens of seconds)."""
    return (7, 2) if n <= 2048 else (5, 1) if n <= 4096 else (3, 1) if n <= 8192 else (2, 1)


def time_all(sizes: list[int]) -> dict:
    results = {}
    for n in sizes:
        x = torch.randn(1, n, DIM, device=DEVICE, dtype=DTYPE)
        repeats, warmup = repeats_for(n)
        for mode, make in (("fwd", forward), ("fwd+bwd", forward_backward)):
            fns = {label: make(module(label), x) for label in CONFIGS}
            times = interleaved(fns, repeats=repeats, warmup=warmup)
            for label, ts in times.items():
                results.setdefault(label, {}).setdefault(mode, {})[n] = median(ts)
            print(n, mode, {k: round(median(v), 4) for k, v in times.items()}, flush=True)
    return results


PROBE = """
import sys, json, torch
sys.path.insert(0, "benchmarks")
from mechanisms_speed import module
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
def peak_since_reset():  # VmHWM of this process's memory map, reset by writing 5 to clear_refs
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM"))
def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
label, n = sys.argv[1], int(sys.argv[2])
m, x = module(label), torch.randn(1, n, 512)
m(torch.randn(1, 64, 512, requires_grad=True)).sum().backward()  # library start-up allocations happen here
m.zero_grad(set_to_none=True)
out = {}
base = rss()
reset_peak()
with torch.no_grad():
    m(x)
out["fwd"] = peak_since_reset() - base
xg = x.clone().requires_grad_()
base = rss()
reset_peak()
m(xg).sum().backward()
out["fwd+bwd"] = peak_since_reset() - base
print(json.dumps(out))
"""


def memory_all(sizes: list[int]) -> dict:
    results = {}
    for n in sizes:
        for label in CONFIGS:
            proc = subprocess.run([sys.executable, "-c", PROBE, label, str(n)], capture_output=True, text=True,
                                  check=True)
            results.setdefault(label, {})[n] = json.loads(proc.stdout.strip().splitlines()[-1])
            print(n, label, results[label][n], flush=True)
    return results


def crossover(ratios: dict[int, float]) -> str:
    """First length from which the mechanism stays faster than SDPA (log-linear interpolation between sizes)."""
    sizes = sorted(ratios)
    if all(ratios[n] >= 1 for n in sizes[-1:]):
        return f"> {sizes[-1]}"
    first = next(i for i in range(len(sizes)) if all(ratios[n] < 1 for n in sizes[i:]))
    if first == 0:
        return f"≤ {sizes[0]}"
    a, b = sizes[first - 1], sizes[first]
    ra, rb = math.log(ratios[a]), math.log(ratios[b])
    return f"≈ {round(math.exp(math.log(a) + (math.log(b) - math.log(a)) * ra / (ra - rb)))}"


# the reference library's published ratios to SDPA at N = 8192 (forward, forward+backward); its local attention
# and Scatterbrain use blocks, so the block rows are the like-for-like comparison
ANCHOR = {"local w=128": (0.13, 0.13), "local block w=128": (0.13, 0.13), "performer m=64": (0.15, 0.15),
          "eva w=128 C=64": (0.20, 0.18), "eva-paper w=128 C=64": (0.20, 0.18), "lara C=64": (0.18, 0.16),
          "scatterbrain w=64 m=64": (0.25, 0.21), "causal eva w=128 c=8": (1.78, 1.25),
          "causal eva-paper w=128 c=8": (1.78, 1.25)}


def report(times: dict, memory: dict, sizes: list[int], memory_sizes: list[int]) -> str:
    lines = [
        "## Efficient attention mechanisms vs. SDPA",
        "",
        f"Standalone modules (`build_attention`, q/k/v/o projections included), dim {DIM}, {HEADS} heads, batch 1, "
        f"{str(DTYPE).removeprefix('torch.')} on {DEVICE}. Interleaved medians of "
        f"{', '.join(f'{repeats_for(n)[0]}' for n in sizes)} runs at "
        f"N = {', '.join(map(str, sizes))}. Causal mechanisms are compared with causal SDPA. Machine: {machine()}; "
        "single numbers are noisy on a shared machine — compare ratios. Reproduce: "
        "`python benchmarks/mechanisms_speed.py`.",
        "",
    ]
    lines += ["### Time ratio to SDPA, forward | forward+backward side by side (SDPA itself in seconds)", "",
              "| mechanism | " + " | ".join(f"N={n} fwd | N={n} fwd+bwd" for n in sizes)
              + " | crossover N (fwd, fwd+bwd) | reference library @8192 (fwd, fwd+bwd) |",
              "|---|" + "---|---|" * len(sizes) + "---|---|"]
    for label in CONFIGS:
        base = "causal softmax (SDPA)" if CONFIGS[label][1] else "softmax (SDPA)"
        if label == base:
            cells = [f"{times[label][mode][n]:.3f} s" for n in sizes for mode in ("fwd", "fwd+bwd")]
            lines.append(f"| {label} | " + " | ".join(cells) + " | – | – |")
            continue
        ratios = {mode: {n: times[label][mode][n] / times[base][mode][n] for n in sizes}
                  for mode in ("fwd", "fwd+bwd")}
        cells = [f"{ratios[mode][n]:.2f}" for n in sizes for mode in ("fwd", "fwd+bwd")]
        anchor = ANCHOR.get(label)
        lines.append(f"| {label} | " + " | ".join(cells)
                     + f" | {crossover(ratios['fwd'])}, {crossover(ratios['fwd+bwd'])} | "
                     + (f"{anchor[0]}, {anchor[1]}" if anchor else "–") + " |")
    lines.append("")
    if memory:
        lines += ["### Peak memory above the input (MB, fresh process per cell)", "",
                  "| mechanism | " + " | ".join(f"fwd N={n} | fwd+bwd N={n}" for n in memory_sizes) + " |",
                  "|---|" + "---|---|" * len(memory_sizes)]
        for label in CONFIGS:
            cells = [f"{memory[label][n][m] / 2**20:.0f}" for n in memory_sizes for m in ("fwd", "fwd+bwd")]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="512,1024,2048,4096,8192,16384")
    parser.add_argument("--memory-sizes", default="2048,4096,8192")
    parser.add_argument("--memory-only", action="store_true",
                        help="re-measure memory only, reusing the timings saved in --json by an earlier run")
    parser.add_argument("--json", default=None, help="also write the raw numbers here")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (memory probes run on the CPU only)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--section", default="mechanisms", help="the section of docs/benchmarks.md to write")
    parser.add_argument("--only", default=None, help="comma-separated labels to time (SDPA rows are always kept)")
    args = parser.parse_args()
    global DEVICE, DTYPE
    DEVICE, DTYPE = torch.device(args.device), getattr(torch, args.dtype)
    if args.only:
        keep = set(args.only.split(",")) | {"softmax (SDPA)", "causal softmax (SDPA)"}
        unknown = keep - set(CONFIGS)
        if unknown:
            parser.error(f"unknown labels {sorted(unknown)}; labels: {sorted(CONFIGS)}")
        for label in set(CONFIGS) - keep:
            del CONFIGS[label]
    if DEVICE.type != "cpu" and args.memory_sizes:
        parser.error("peak-memory probes read /proc RSS (CPU only): pass --memory-sizes '' with --device cuda")
    sizes = [int(s) for s in args.sizes.split(",")]
    memory_sizes = [int(s) for s in args.memory_sizes.split(",")] if args.memory_sizes else []
    if args.memory_only:
        if not args.json:
            parser.error("--memory-only reads the timings from --json")
        with open(args.json) as f:
            saved = json.load(f)["times"]
        times = {label: {mode: {int(n): t for n, t in per.items()} for mode, per in modes.items()}
                 for label, modes in saved.items()}
    else:
        times = time_all(sizes)
    memory = memory_all(memory_sizes) if memory_sizes else {}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"times": times, "memory": memory}, f)
    text = report(times, memory, sizes, memory_sizes)
    print(text)
    update_section(args.section, text)


if __name__ == "__main__":
    main()
