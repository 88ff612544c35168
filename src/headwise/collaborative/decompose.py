"""Rank-``R`` CP decomposition of the per-head bilinear forms ``A_h = W_q^hᵀ W_k^h`` of one attention layer.

Notation (HF ``nn.Linear`` layout, ``q_h = P_h x``): ``P, K: [H, d, D]`` are the per-head query and key weights,
``A_h = P_hᵀ K_h`` is ``[D, D]`` and has rank ≤ d. We look for ``M: [H, R]`` (mixing), ``U, V: [D, R]`` (shared
query / key projections) with ``A_h ≈ U diag(m_h) Vᵀ``, minimising

    Σ_h ‖L_qᵀ (A_h − U diag(m_h) Vᵀ) L_k‖²_F

where ``L_q = L_k = I`` for the weight objective and ``L_q L_qᵀ = E[x xᵀ]`` (query tokens), ``L_k L_kᵀ =
Cov_seq(x)`` (key tokens centred per sequence) for the data-aware objective, which then equals the squared error
of the attention scores on the calibration tokens, up to terms the softmax ignores. Whitening keeps the problem a
plain CP problem on ``P'_h = P_h L_q``, ``K'_h = K_h L_k``; the factors map back with ``U = L_q⁻ᵀ U'``.

The tensor ``[H, D, D]`` is never formed: every ALS step only needs ``P_h U`` and ``K_h V`` (``[H, d, R]``), so
one sweep costs ``O(H·d·D·R)`` instead of ``O(H·D²·R)``, and the error is exact from Gram matrices.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass

import torch
from einops import einsum

from ..errors import HeadwiseError


@dataclass
class Factors:
    """``A_h ≈ U diag(M[h]) Vᵀ``; ``U, V: [D, R]`` (unit columns after ALS), ``M: [H, R]``."""

    mixing: torch.Tensor
    query: torch.Tensor
    key: torch.Tensor

    @property
    def rank(self) -> int:
        return self.mixing.shape[1]


@dataclass
class Decomposition:
    factors: Factors
    device_error: torch.Tensor  # 0-dim, on the inputs' device (no host sync): see ``error``
    iterations: int

    @property
    def error(self) -> float:
        """Relative error ‖T − T̂‖ / ‖T‖ in the objective's (possibly whitened) metric, read on the host."""
        return float(self.device_error)


def target_norm2(P: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """‖T‖² = Σ_h ‖P_hᵀ K_h‖² = Σ_h tr(P_h P_hᵀ · K_h K_hᵀ)."""
    return ((P @ P.transpose(1, 2)) * (K @ K.transpose(1, 2))).sum()


def relative_error(P: torch.Tensor, K: torch.Tensor, f: Factors) -> torch.Tensor:
    """‖T − T̂‖ / ‖T‖ from Gram matrices: ‖T‖² − 2⟨T, T̂⟩ + ‖T̂‖² (no [H, D, D] tensor); a 0-dim tensor on the
    inputs' device (no host sync: ``float()`` it where a number is reported)."""
    inner = ((P @ f.query) * (K @ f.key) * f.mixing[:, None]).sum()
    model = ((f.mixing.T @ f.mixing) * (f.query.T @ f.query) * (f.key.T @ f.key)).sum()
    t2 = target_norm2(P, K)
    return ((t2 - 2 * inner + model).clamp(min=0) / t2).sqrt()


def exact_factors(P: torch.Tensor, K: torch.Tensor) -> Factors:
    """The reparametrisation with ``R = H·d``: ``U = [P_1ᵀ … P_Hᵀ]``, ``V = [K_1ᵀ … K_Hᵀ]``, ``M`` block one-hot."""
    H, d, _ = P.shape
    mixing = torch.kron(torch.eye(H, dtype=P.dtype, device=P.device), torch.ones(1, d, dtype=P.dtype, device=P.device))
    return Factors(mixing, P.flatten(0, 1).T.clone(), K.flatten(0, 1).T.clone())


def block_factors(P: torch.Tensor, K: torch.Tensor, rank: int) -> Factors:
    """The best rank-``rank`` form in which every shared dimension serves one head (block mixing).

    ``A_h = Q_p (R_p R_kᵀ) Q_kᵀ`` with thin QRs ``P_hᵀ = Q_p R_p``, ``K_hᵀ = Q_k R_k``; the SVD of the small
    ``[d, d]`` core gives every head's singular triplets, and keeping the ``rank`` largest singular values over
    all heads is optimal among block-structured forms (Eckart–Young per head, greedy across heads).
    """
    H, d, _ = P.shape
    Qp, Rp = torch.linalg.qr(P.transpose(1, 2))  # [H, D, d], [H, d, d]
    Qk, Rk = torch.linalg.qr(K.transpose(1, 2))
    Uy, S, Vyh = torch.linalg.svd(Rp @ Rk.transpose(1, 2))  # [H, d, d], [H, d], [H, d, d]
    top = S.flatten().topk(rank).indices
    head, comp = top // d, top % d
    query = (Qp @ Uy)[head, :, comp].T  # [D, R]
    key = (Qk @ Vyh.transpose(1, 2))[head, :, comp].T
    mixing = torch.zeros(H, rank, dtype=P.dtype, device=P.device)
    mixing[head, torch.arange(rank, device=P.device)] = S[head, comp]
    return Factors(mixing, query, key)


def hosvd_factors(P: torch.Tensor, K: torch.Tensor, rank: int) -> Factors:
    """HOSVD start: ``U``, ``V`` the top singular vectors of the query- and key-mode unfoldings of ``T``
    (eigenvectors of ``Σ_h A_h A_hᵀ`` and ``Σ_h A_hᵀ A_h``), ``M`` their least-squares mixing."""
    KK, PP = K @ K.transpose(1, 2), P @ P.transpose(1, 2)
    query = torch.linalg.eigh(einsum(P, KK, P, "h a i, h a b, h b j -> i j")).eigenvectors[:, -rank:]
    key = torch.linalg.eigh(einsum(K, PP, K, "h a i, h a b, h b j -> i j")).eigenvectors[:, -rank:]
    mixing = ((P @ query) * (K @ key)).sum(1)  # the Gram matrix is I for orthonormal U, V
    return Factors(mixing, query, key)


def _solve(gram: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """``rhs @ gram⁻¹`` for a symmetric PSD ``gram``, with a tiny ridge against rank deficiency."""
    gram64 = gram.double()
    eye = torch.eye(gram.shape[0], dtype=gram64.dtype, device=gram.device)
    ridge = 1e-12 * gram64.diagonal().mean().clamp(min=1e-30)
    return torch.linalg.solve(gram64 + ridge * eye, rhs.T.double()).T.to(rhs.dtype)


def _normalise(f: Factors) -> Factors:
    nq, nk = f.query.norm(dim=0).clamp(min=1e-30), f.key.norm(dim=0).clamp(min=1e-30)
    return Factors(f.mixing * (nq * nk), f.query / nq, f.key / nk)


def _where(keep: torch.Tensor, new: Factors, old: Factors) -> Factors:
    """``new`` where the 0-dim bool ``keep`` holds, else ``old`` (selected on the device, no host sync)."""
    return Factors(*(torch.where(keep, a, b) for a, b in zip(astuple(new), astuple(old))))


def als(P: torch.Tensor, K: torch.Tensor, start: Factors, iterations: int, tol: float = 1e-7) -> Decomposition:
    """Alternating least squares on the factored targets, keeping the best sweep. ``tol > 0``: stops early when
    the error improves by < ``tol`` (or worsens), which reads the error on the host once per sweep; ``tol = 0``:
    runs all ``iterations`` sweeps without a host sync (the kept factors and error are the same: a rejected
    sweep is repeated from the same factors)."""
    f, error, done = _normalise(start), relative_error(P, K, start), 0
    Pt, Kt = P.flatten(0, 1).T, K.flatten(0, 1).T  # [D, H·d]: the MTTKRPs become single matmuls
    for done in range(1, iterations + 1):
        gram_m = f.mixing.T @ f.mixing
        query = _solve(gram_m * (f.key.T @ f.key), Pt @ ((K @ f.key) * f.mixing[:, None]).flatten(0, 1))
        PU = P @ query
        key = _solve(gram_m * (query.T @ query), Kt @ (PU * f.mixing[:, None]).flatten(0, 1))
        mixing = _solve((query.T @ query) * (key.T @ key), (PU * (K @ key)).sum(1))
        candidate = _normalise(Factors(mixing, query, key))
        new = relative_error(P, K, candidate)
        better = new <= error
        f, gain, error = _where(better, candidate, f), error - new, torch.where(better, new, error)
        if tol > 0 and bool(gain < tol):  # also when worse (gain < 0)
            break
    return Decomposition(f, error, done)


def tensorly_als(P: torch.Tensor, K: torch.Tensor, start: Factors, iterations: int) -> Decomposition:
    """The same start refined by ``tensorly.decomposition.parafac`` on the dense ``[H, D, D]`` tensor (torch
    backend): slower (``O(H·D²·R)`` per sweep) but exposes tensorly's options."""
    import tensorly as tl
    from tensorly.cp_tensor import CPTensor
    from tensorly.decomposition import parafac

    dense = einsum(P, K, "h d i, h d j -> h i j")
    with tl.backend_context("pytorch"):
        init = CPTensor((None, [start.mixing, start.query, start.key]))
        cp = parafac(dense, start.rank, n_iter_max=iterations, init=init, tol=0, normalize_factors=False)
    f = Factors(*cp.factors)
    return Decomposition(f, relative_error(P, K, f), iterations)


def whitening(cov: torch.Tensor, ridge: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(L, L⁻ᵀ)`` with ``L Lᵀ = cov + ridge·mean(diag)·I`` (symmetric square root by eigh)."""
    cov = (cov + cov.T) / 2
    eye = torch.eye(cov.shape[0], dtype=cov.dtype, device=cov.device)
    lam, Q = torch.linalg.eigh(cov + ridge * cov.diagonal().mean() * eye)
    lam = lam.clamp(min=lam.max() * 1e-12)
    return Q * lam.sqrt(), Q * lam.rsqrt()


def decompose(P: torch.Tensor, K: torch.Tensor, rank: int, *, init: str = "auto", iterations: int = 20,
              tol: float = 1e-6, solver: str = "als", covariance: tuple[torch.Tensor, torch.Tensor] | None = None,
              ridge: float = 1e-2) -> Decomposition:
    """Factors of ``A_h = P_hᵀ K_h`` (``P, K: [H, d, D]``) at ``rank``. Iterates in float32 (float64 inputs:
    float64) and solves the small ``[R, R]`` systems in float64.

    ``rank ≥ H·d`` returns the exact block form without iterating. ``covariance = (C_q, C_k)`` selects the
    data-aware objective (the reported error is then the relative score error on the calibration tokens).
    ``init="auto"``: ``"block"`` for the data-aware objective, ``"hosvd"`` for the weight objective (on MiniLM,
    rank 192, 20 sweeps: score error 0.060 vs. 0.084; 10 sweeps: weight error 0.414 vs. 0.422).
    """
    dtype = torch.float64 if P.dtype == torch.float64 else torch.float32
    P, K = P.detach().to(dtype), K.detach().to(dtype)
    H, d, _ = P.shape
    if rank >= H * d:
        return Decomposition(exact_factors(P, K), P.new_zeros(()), 0)
    if covariance is not None:
        (Lq, Lq_inv_t), (Lk, Lk_inv_t) = (whitening(c.double(), ridge) for c in covariance)
        P, K = (P.double() @ Lq).to(dtype), (K.double() @ Lk).to(dtype)
    starts = {"block": block_factors, "hosvd": hosvd_factors}
    if init == "auto":
        init = "block" if covariance is not None else "hosvd"
    if init not in starts:
        raise HeadwiseError(f"unknown init {init!r}; use auto, {', '.join(starts)}")
    start = starts[init](P, K, rank)
    if solver == "als":
        result = als(P, K, start, iterations, tol)
    elif solver == "tensorly":
        result = tensorly_als(P, K, start, iterations)
    else:
        raise HeadwiseError(f"unknown solver {solver!r}; use 'als' or 'tensorly'")
    if covariance is not None:
        f = result.factors
        result.factors = Factors(f.mixing, (Lq_inv_t @ f.query.double()).to(dtype),
                                 (Lk_inv_t @ f.key.double()).to(dtype))
    return result
