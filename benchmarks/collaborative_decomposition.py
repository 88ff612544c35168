"""Decomposing MiniLM's attention: the seed's algorithm vs. headwise, on the same layers.

Seed: ``tensorly.decomposition.parafac`` (PyTorch backend, float32), random init, 100 iterations, on the dense
``[H, D, D]`` stack of ``W_q^hᵀ W_k^h``. headwise: ``decompose`` with its defaults (HOSVD start, 20 factored ALS
sweeps, float32), weight objective. Both report the relative error ‖T − T̂‖ / ‖T‖; times are medians of
interleaved runs (the seed runs once per layer: it takes seconds).
"""

from __future__ import annotations

import time

import tensorly as tl
import torch
from tensorly.decomposition import parafac

import headwise
from common import machine, median, update_section
from headwise.collaborative import CollaborativeConfig, decompose

LAYERS = [0, 2, 4]
DKS = [256, 192, 128]


def seed(P: torch.Tensor, K: torch.Tensor, rank: int) -> tuple[float, float]:
    tl.set_backend("pytorch")
    dense = torch.einsum("hdi,hdj->hij", P, K).float()
    start = time.perf_counter()
    cp = parafac(dense, rank, n_iter_max=100, init="random", random_state=0)
    seconds = time.perf_counter() - start
    return seconds, ((tl.cp_to_tensor(cp) - dense).norm() / dense.norm()).item()


def ours(P: torch.Tensor, K: torch.Tensor, rank: int, repeats: int = 5) -> tuple[float, float]:
    config = CollaborativeConfig(dk=rank)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = decompose(P, K, rank, init=config.init, iterations=config.iterations, tol=config.tol)
        times.append(time.perf_counter() - start)
    return median(times), result.error


def main() -> None:
    torch.set_num_threads(1)  # shared 2-core machine: one thread each, so OpenMP spinning does not distort
    model, _ = headwise.load_model(with_tokenizer=False)
    sites = headwise.find_sites(model)
    rows = []
    for dk in DKS:
        for layer in LAYERS:
            P, K = sites[layer].q.weight.detach(), sites[layer].k.weight.detach()
            t_ours, e_ours = ours(P, K, dk)
            t_seed, e_seed = seed(P, K, dk)
            rows.append((dk, layer, t_seed, e_seed, t_ours, e_ours))
            print(rows[-1], flush=True)
    lines = [
        "### Collaborative decomposition: seed algorithm vs. headwise (MiniLM)",
        "",
        f"Machine: {machine()}. Seed: tensorly `parafac` (PyTorch backend), random init, 100 iterations, on the "
        "dense `[12, 384, 384]` tensor. headwise: HOSVD start + 20 factored ALS sweeps (`decompose` defaults). "
        "Error: relative Frobenius error of the stacked `W_q^hᵀ W_k^h`. "
        "`python benchmarks/collaborative_decomposition.py`.",
        "",
        "| D~k | layer | seed time (s) | seed error | headwise time (s) | headwise error | speed-up |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {dk} | {layer} | {ts:.2f} | {es:.3f} | {to:.3f} | {eo:.3f} | {ts / to:.0f}× |"
              for dk, layer, ts, es, to, eo in rows]
    for dk in DKS:
        sel = [r for r in rows if r[0] == dk]
        ts, to = sum(r[2] for r in sel), sum(r[4] for r in sel)
        lines.append(f"| **{dk}** | all | {ts:.2f} | {sum(r[3] for r in sel) / len(sel):.3f} | {to:.3f} | "
                     f"{sum(r[5] for r in sel) / len(sel):.3f} | **{ts / to:.0f}×** |")
    update_section("collaborative-decomposition", "\n".join(lines))


if __name__ == "__main__":
    main()
