"""Closed-form fits of shared projections on input moments.

A projection is a row block ``W[r, n]`` acting on the site input ``x[n]`` (``n = D`` or ``D+1`` with biases);
``Σ = E[x xᵀ]`` makes ``‖W x‖²`` a quadratic form, ``E‖W x‖² = tr(W Σ Wᵀ)``. ``Σ = I`` is the weight-space fit.
"""

from __future__ import annotations

import torch


def whitener(sigma: torch.Tensor, ridge: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(S, S⁻¹)`` with ``S Sᵀ = Σ + ridge·mean_eig·I`` (Cholesky, float64)."""
    sigma = sigma.double()
    eye = torch.eye(sigma.shape[0], dtype=sigma.dtype)
    s = torch.linalg.cholesky(sigma + ridge * sigma.diagonal().mean() * eye)
    return s, torch.linalg.solve_triangular(s, eye, upper=False)


def shared_rows(blocks: torch.Tensor, sigma: torch.Tensor, rank: int, ridge: float) -> torch.Tensor:
    """The ``rank`` rows ``P[rank, n]`` whose outputs best explain every row of ``blocks[m, n]`` on ``Σ``:
    ``min Σ_i min_e E(b_i x − e P x)²``, the top right singular subspace of ``blocks·S`` mapped back by ``S⁻¹``
    (reduced-rank regression). ``P Σ Pᵀ ≈ I``."""
    b = blocks.double()
    return shared_rows_of_gram(b.mT @ b, sigma, rank, ridge)


def shared_rows_of_gram(gram: torch.Tensor, sigma: torch.Tensor, rank: int, ridge: float) -> torch.Tensor:
    """:func:`shared_rows` from the blocks' Gram matrix ``BᵀB [n, n]`` alone (the blocks need never exist)."""
    s, s_inv = whitener(sigma, ridge)
    _, vectors = torch.linalg.eigh(s.mT @ gram.double() @ s)  # (B S)ᵀ (B S)
    return vectors[:, -rank:].flip(-1).mT @ s_inv


def regress(target: torch.Tensor, basis: torch.Tensor, sigma: torch.Tensor, ridge: float) -> torch.Tensor:
    """Least-squares map ``E[t, r]`` with ``target x ≈ E · basis x`` on ``Σ``: ``T Σ Pᵀ (P Σ Pᵀ)⁻¹``."""
    sigma = sigma.double() + ridge * sigma.diagonal().mean().double() * torch.eye(sigma.shape[0], dtype=torch.float64)
    cross, gram = target.double() @ sigma @ basis.double().mT, basis.double() @ sigma @ basis.double().mT
    return torch.linalg.solve(gram, cross.mT).mT


def _by_real(z: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """``z @ m`` for a complex ``z`` and a real ``m`` (no complex copy of ``m``)."""
    return torch.complex(z.real.contiguous() @ m, z.imag.contiguous() @ m)


def shared_pairs(keys: torch.Tensor, weights: torch.Tensor, sigma: torch.Tensor, ridge: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary-compatible merge of ``m`` keys: per frequency pair ``f`` one shared complex functional ``r_f`` and
    per-key complex scalars ``c[m, f]`` with ``z_{i,f}(x) ≈ c_{i,f}·r_f x`` (a weighted complex rank-1 fit).

    ``keys[m, d/2, n]`` complex (:func:`rotary.to_complex` of each key's rows), ``weights[m, d/2]`` ≥ 0
    (how much each key's error costs per pair, e.g. the root energy of the queries that read it).
    Returns ``(r[d/2, n] complex, c[m, d/2] complex)``."""
    s, s_inv = whitener(sigma, ridge)
    keys = keys.to(torch.complex128)
    weighted = (weights.double()[..., None] * keys).permute(1, 0, 2)  # [f, m, n]
    _, _, vh = torch.linalg.svd(_by_real(weighted, s), full_matrices=False)
    shared = _by_real(vh[:, 0, :], s_inv)  # [f, n]: the functional r_f (r_f·x), S⁻¹ undoes whitening
    sigma = sigma.double()
    sig = sigma + ridge * sigma.diagonal().mean() * torch.eye(sigma.shape[0], dtype=torch.float64)
    read = _by_real(shared.conj(), sig)  # [f, n]: E[conj(r_f x) xᵀ]
    # c_{i,f} = E[conj(r x) z_i x] / E|r x|²
    cross = torch.einsum("fk,mfk->mf", read, keys)
    norm = (read * shared).sum(-1).real
    return shared, cross / norm
