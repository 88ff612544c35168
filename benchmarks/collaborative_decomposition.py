"""Decomposing MiniLM's attention: the seed's algorithm vs. headwise, on the same layers.

Seed: ``tensorly.decomposition.parafac`` (PyTorch backend, float32), random init, 100 iterations, on the dense
``[H, D, D]`` stack of ``W_q^hᵀ W_k^h``. headwise: ``decompose`` (HOSVD start, float32, weight objective) with its
default 20 factored ALS sweeps and with 60. Both report the relative error ‖T − T̂‖ / ‖T‖; times are medians of
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
SWEEPS = [20, 60]  # the default, and enough to be below the seed's error on every layer


def seed(P: torch.Tensor, K: torch.Tensor, rank: int) -> tuple[float, float]:
    tl.set_backend("pytorch")
    dense = torch.einsum("hdi,hdj->hij", P, K).float()
    start = time.perf_counter()
    cp = parafac(dense, rank, n_iter_max=100, init="random", random_state=0)
    seconds = time.perf_counter() - start
    return seconds, ((tl.cp_to_tensor(cp) - dense).norm() / dense.norm()).item()


def ours(P: torch.Tensor, K: torch.Tensor, rank: int, sweeps: int, repeats: int = 5) -> tuple[float, float]:
    config = CollaborativeConfig(dk=rank, iterations=sweeps)
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
            t_seed, e_seed = seed(P, K, dk)
            rows.append((dk, layer, t_seed, e_seed, *(x for n in SWEEPS for x in ours(P, K, dk, n))))
            print(rows[-1], flush=True)
    lines = [
        "### Collaborative decomposition: seed algorithm vs. headwise (MiniLM)",
        "",
        f"Machine: {machine()}. Seed: tensorly `parafac` (PyTorch backend), random init, 100 iterations, on the "
        "dense `[12, 384, 384]` tensor. headwise: HOSVD start + 20 factored ALS sweeps (`decompose` defaults) or 60. "
        "Error: relative Frobenius error of the stacked `W_q^hᵀ W_k^h`. "
        "`python benchmarks/collaborative_decomposition.py`.",
        "",
        "| D~k | layer | seed time (s) | seed error | " + " | ".join(
            f"headwise {n} sweeps: time (s) | error | speed-up" for n in SWEEPS) + " |",
        "|---|---|---|---|" + "---|---|---|" * len(SWEEPS),
    ]

    def ours_cells(row, total=False) -> str:
        ts = row[2]
        cells = []
        for i in range(len(SWEEPS)):
            to, eo = row[4 + 2 * i], row[5 + 2 * i]
            speed = f"**{ts / to:.0f}×**" if total else f"{ts / to:.0f}×"
            cells.append(f"{to:.3f} | {eo:.3f} | {speed}")
        return " | ".join(cells)

    lines += [f"| {r[0]} | {r[1]} | {r[2]:.2f} | {r[3]:.3f} | {ours_cells(r)} |" for r in rows]
    for dk in DKS:
        sel = [r for r in rows if r[0] == dk]
        total = [dk, "all", sum(r[2] for r in sel), sum(r[3] for r in sel) / len(sel)]
        for i in range(len(SWEEPS)):
            total += [sum(r[4 + 2 * i] for r in sel), sum(r[5 + 2 * i] for r in sel) / len(sel)]
        lines.append(f"| **{dk}** | all | {total[2]:.2f} | {total[3]:.3f} | {ours_cells(total, total=True)} |")
    update_section("collaborative-decomposition", "\n".join(lines))


if __name__ == "__main__":
    main()
