"""headwise's efficient attention vs. the reference library (HKUNLP efficient-attention), timed side by side.

Each pair is one mechanism at the same settings in both libraries: a standalone module with its q/k/v/o
projections, dim 512, 8 heads, batch 1, the same input. Forward runs in eval mode without gradients,
forward+backward in train mode (where both libraries draw their randomness as in training). Times are
interleaved medians (every module of one length and mode in one round-robin, SDPA and the reference's own
softmax included), so the ratio ``headwise / reference`` is measured, not taken from a paper. The reference is
imported from a checkout you give (nothing of it is copied here); it needs ``einops`` and ``numpy``, and ``timm``
only for an initialiser (``torch.nn.init.trunc_normal_`` stands in when timm is missing; timing is unaffected).

    git clone https://github.com/HKUNLP/efficient-attention /tmp/hkunlp
    python benchmarks/mechanisms_vs_reference.py --reference /tmp/hkunlp/efficient-attention

Writes the ``mechanisms-vs-reference`` section of docs/benchmarks.md and ``--json`` (default
benchmarks/results/mechanisms_vs_reference_cpu.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from pathlib import Path

import torch
from common import interleaved, machine, median, update_section

from headwise.io import atomic_write_text
from headwise.mechanisms import build_attention

DIM, HEADS = 512, 8
# label -> ((headwise mechanism, its args), (reference attn_name, its args)); non-causal (the reference's causal
# EVA is a fairseq incremental-decoding module with another call signature)
PAIRS = {
    "softmax": (("softmax", {}), ("softmax", {})),
    "local block w=128": (("local", {"window": 128, "mode": "block"}), ("local", {"window_size": 128})),
    "performer m=64": (("performer", {"features": 64}), ("performer", {"approx_attn_dim": 64,
                                                                       "proj_method": "favorp"})),
    "lara C=64": (("lara", {"num_landmarks": 64}), ("lara", {"num_landmarks": 64, "alpha_coeff": 2.0,
                                                             "mis_type": "mis-opt"})),
    "eva-paper w=128 C=64": (("eva-paper", {"window": 128, "num_landmarks": 64}),
                             ("eva", {"window_size": 128, "num_landmarks": 64, "adaptive_proj": "default"})),
    "scatterbrain w=64 m=64": (("scatterbrain", {"window": 64, "features": 64}),
                               ("scatterbrain", {"window_size": 64, "approx_attn_dim": 64,
                                                 "proj_method": "favorp"})),
}


def import_reference(path: Path):
    """The reference's ``AttentionFactory`` from a checkout of its ``efficient-attention`` folder."""
    if not (path / "efficient_attention" / "__init__.py").is_file():
        sys.exit(f"--reference {path}: no efficient_attention/__init__.py there; pass the 'efficient-attention' "
                 "folder of a checkout of https://github.com/HKUNLP/efficient-attention")
    try:
        import timm.models.layers  # noqa: F401
    except ImportError:  # the reference imports timm only for trunc_normal_
        layers = types.ModuleType("timm.models.layers")
        layers.trunc_normal_ = torch.nn.init.trunc_normal_
        for name, module in (("timm", types.ModuleType("timm")), ("timm.models", types.ModuleType("timm.models")),
                             ("timm.models.layers", layers)):
            sys.modules.setdefault(name, module)
    sys.path.insert(0, str(path))
    from efficient_attention import AttentionFactory
    return AttentionFactory


def modules(factory, label: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    (ours, ours_args), (ref, ref_args) = PAIRS[label]
    torch.manual_seed(0)
    mine = build_attention(ours, dim=DIM, num_heads=HEADS, **ours_args)
    theirs = factory.build_attention(ref, {"dim": DIM, "num_heads": HEADS, **ref_args})
    return mine, theirs


def forward(m: torch.nn.Module, x: torch.Tensor):
    m.eval()

    def run():
        with torch.no_grad():
            m(x)
    return run


def forward_backward(m: torch.nn.Module, x: torch.Tensor):
    m.train()

    def run():
        xg = x.detach().requires_grad_()
        m(xg).sum().backward()
        m.zero_grad(set_to_none=True)
    return run


def repeats_for(n: int) -> tuple[int, int]:
    """(repeats, warm-up rounds): 3 repeats at 8192 moved single cells by ±10% between runs, 5 by up to 17%."""
    return (9, 2) if n <= 4096 else (7, 1)


def time_all(factory, sizes: list[int]) -> dict:
    results: dict = {}
    for n in sizes:
        x = torch.randn(1, n, DIM)
        repeats, warmup = repeats_for(n)
        for mode, make in (("fwd", forward), ("fwd+bwd", forward_backward)):
            fns = {}
            for label in PAIRS:
                mine, theirs = modules(factory, label)
                fns[f"headwise {label}"], fns[f"reference {label}"] = make(mine, x), make(theirs, x)
            times = interleaved(fns, repeats=repeats, warmup=warmup)
            for name, ts in times.items():
                results.setdefault(name, {}).setdefault(mode, {})[n] = median(ts)
            print(n, mode, {k: round(median(v), 4) for k, v in times.items()}, flush=True)
    return results


def report(times: dict, sizes: list[int]) -> str:
    sdpa = "headwise softmax"
    lines = ["## Efficient attention: headwise vs. the reference library, side by side", "",
             f"Standalone modules (q/k/v/o projections included), dim {DIM}, {HEADS} heads, batch 1, fp32, CPU; "
             "forward in eval mode without gradients, forward+backward in train mode. The reference library "
             "(HKUNLP efficient-attention) is imported from a checkout and timed in the same round-robin. "
             f"Interleaved medians of {', '.join(str(repeats_for(n)[0]) for n in sizes)} runs at "
             f"N = {', '.join(map(str, sizes))}. Machine: {machine()}. Reproduce: "
             "`python benchmarks/mechanisms_vs_reference.py --reference PATH/efficient-attention`.", "",
             "**headwise / reference** time (below 1: headwise is faster), and each one's time as a ratio to "
             "headwise's SDPA softmax (the reference's `softmax` is explicit matmul + softmax).", "",
             "| mechanism | " + " | ".join(f"N={n} fwd | N={n} fwd+bwd" for n in sizes)
             + " | vs SDPA @" + str(sizes[-1]) + " fwd, fwd+bwd: headwise | reference |",
             "|---|" + "---|---|" * len(sizes) + "---|---|"]
    last = sizes[-1]
    for label in PAIRS:
        mine, theirs = times[f"headwise {label}"], times[f"reference {label}"]
        cells = [f"{mine[mode][n] / theirs[mode][n]:.2f}" for n in sizes for mode in ("fwd", "fwd+bwd")]
        to_sdpa = [", ".join(f"{t[mode][last] / times[sdpa][mode][last]:.2f}" for mode in ("fwd", "fwd+bwd"))
                   for t in (mine, theirs)]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {to_sdpa[0]} | {to_sdpa[1]} |")
    lines += ["", "SDPA (headwise softmax) in seconds: " + ", ".join(
        f"N={n}: {times[sdpa]['fwd'][n]:.3f} / {times[sdpa]['fwd+bwd'][n]:.3f}" for n in sizes)
        + " (fwd / fwd+bwd). Raw times: `benchmarks/results/mechanisms_vs_reference_cpu.json`.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", type=Path, required=True,
                        help="the efficient-attention folder of a HKUNLP/efficient-attention checkout")
    parser.add_argument("--sizes", default="2048,4096,8192")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path,
                        default=Path(__file__).parent / "results" / "mechanisms_vs_reference_cpu.json")
    parser.add_argument("--no-doc", action="store_true", help="print the table, leave docs/benchmarks.md alone")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    factory = import_reference(args.reference)
    sizes = [int(s) for s in args.sizes.split(",")]
    times = time_all(factory, sizes)
    atomic_write_text(args.json, json.dumps({"machine": machine(), "sizes": sizes, "times": times}, indent=1))
    markdown = report(times, sizes)
    print(markdown)
    if not args.no_doc:
        update_section("mechanisms-vs-reference", markdown)


if __name__ == "__main__":
    main()
