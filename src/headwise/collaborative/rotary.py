"""Collaborative heads under rotary positions (Llama, Mistral): shared rotation planes, complex mixing.

Rotary attention (transformers' ``rotate_half`` layout) pairs query/key dimension ``c`` with ``c + d/2`` into
a plane turned by ``θ_c · position``. Written as complex numbers ``q_c = p_{h,c}·x`` (``p = P[h, c] + i P[h,
c + d/2]``, ``[D]`` complex) and ``k_c = k_{g,c}·x``, head ``h`` (key/value group ``g``) scores

    s_h(i, j) = Σ_c Re( conj(q_c(x_i)) k_c(x_j) e^{iθ_c (j−i)} ) = Σ_c Re( x_iᵀ A_{h,c} x_j e^{iθ_c (j−i)} )

with ``A_{h,c} = conj(p_{h,c}) k_{g,c}ᵀ`` (complex ``[D, D]``, rank 1). A scalar — even a complex one —
commutes with a plane rotation, so shared planes that each keep one frequency and mix per head by a complex
scalar are position-exact: the ``R/2`` shared planes ``r`` (frequency ``f(r)``) give

    s_h(i, j) = Σ_r Re( conj(n_{h,r} u_r·x_i) (v_r·x_j) e^{iθ_f(r) (j − i)} ),

i.e. per frequency ``c`` a complex CP problem ``A_{h,c} ≈ Σ_{r: f(r)=c} m_{h,r} α_r β_rᵀ`` (``m = conj n``,
``α = conj u``, ``β = v``). The ``R/2`` planes are shared out among frequencies by the block start (the largest
``|p_{h,c}|·|k_{g,c}|`` over all heads and frequencies, each a rank-1 term it makes exact), then complex ALS
refines every frequency, batched over frequencies (unused planes are masked). ``R = H·d`` is exact.

The data-aware objective whitens with the query and key input moments as the real case does; the keys are
*not* centred, because under rotation a key term constant over positions still changes the scores.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from einops import rearrange

from .decompose import whitening


@dataclass
class RotaryFactors:
    """``A_{h,c} ≈ Σ_{r: f(r)=c} m_{h,r} α_r β_rᵀ``; ``frequencies[R/2]`` (long, into the head's ``d/2``
    rotary frequencies), ``mixing[H, R/2]``, ``query[D, R/2]`` (``α``), ``key[D, R/2]`` (``β``), complex."""

    frequencies: torch.Tensor
    mixing: torch.Tensor
    query: torch.Tensor
    key: torch.Tensor

    def real_weights(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The module's weights: shared ``W~q, W~k: [R, D]`` (plane ``r`` on rows ``r`` and ``r + R/2``, the
        ``rotate_half`` layout) and the real mixing ``[H, R] = [Re n | Im n]`` with ``n = conj(m)``."""
        u = self.query.conj()
        query = torch.cat([u.real.T, u.imag.T]).to(dtype)
        key = torch.cat([self.key.real.T, self.key.imag.T]).to(dtype)
        n = self.mixing.conj()
        return query, key, torch.cat([n.real, n.imag], dim=1).to(dtype)


@dataclass
class RotaryDecomposition:
    factors: RotaryFactors
    device_error: torch.Tensor  # relative error in the objective's metric (0-dim, on the inputs' device)
    device_weight_error: torch.Tensor  # relative error of the unwhitened forms
    iterations: int


def complex_planes(W: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[n, d, D]`` real per-head rows → ``[d/2, n, D]`` complex rows ``W[:, c] + i W[:, c + d/2]`` (``dtype``:
    the real precision)."""
    half = W.shape[1] // 2
    planes = torch.complex(W[:, :half].to(dtype), W[:, half:].to(dtype))
    return rearrange(planes, "n c D -> c n D")


def _hdot(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``xᵀ conj(y)`` batched over the leading axis: ``[C, a, D] × [C, D, r] → [C, a, r]``."""
    return x @ y.conj()


def _gram(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``(xᵀ conj x) ⊙ (yᵀ conj y)`` for ``x: [C, a, r]``, ``y: [C, b, r]`` → ``[C, r, r]``."""
    return (x.transpose(1, 2) @ x.conj()) * (y.transpose(1, 2) @ y.conj())


def _solve(gram: torch.Tensor, rhs: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """``X`` with ``X gram = rhs`` (``[C, n, r]``), unused planes (``active[C, r]`` false) kept at 0."""
    both = active[:, :, None] & active[:, None, :]
    eye = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
    scale = gram.diagonal(dim1=1, dim2=2).real.mean(-1).clamp(min=1e-30)[:, None, None]
    system = torch.where(both, gram, 0) + torch.where(active[:, :, None], 1e-12 * scale * eye, eye)
    return torch.linalg.solve(system, torch.where(active[:, None, :], rhs, 0), left=False)


Planes = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # mixing [C, H, n], query [C, D, n], key [C, D, n]


def _errors2(a: torch.Tensor, b: torch.Tensor, mixing: torch.Tensor, query: torch.Tensor,
             key: torch.Tensor) -> torch.Tensor:
    """Squared error per frequency ``‖T_c − T̂_c‖²`` ``[C]`` from Gram matrices (``a, b: [C, H, D]``, the
    targets ``A_{h,c} = a_{h,c} b_{h,c}ᵀ``)."""
    t2 = (a.abs().square().sum(-1) * b.abs().square().sum(-1)).sum(-1)
    inner = (mixing.conj() * _hdot(a, query) * _hdot(b, key)).sum((1, 2)).real
    model = (_gram(mixing, query) * (key.transpose(1, 2) @ key.conj())).sum((1, 2)).real
    return (t2 - 2 * inner + model).clamp(min=0)


def _normalise(mixing: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> Planes:
    """Unit query and key columns, their norms moved into the mixing."""
    nq, nk = query.norm(dim=1, keepdim=True).clamp(min=1e-30), key.norm(dim=1, keepdim=True).clamp(min=1e-30)
    return mixing * (nq * nk), query / nq, key / nk


def block_start(a: torch.Tensor, b: torch.Tensor, planes: int):
    """The ``planes`` largest rank-1 terms ``a_{h,c} b_{h,c}ᵀ`` over all heads and frequencies, each exact in
    one plane: ``(active[C, H], mixing[C, H, H], query[C, D, H], key[C, D, H])``: each frequency has room for
    ``H`` planes and uses its first ``active[c].sum()``."""
    C, H, _ = a.shape
    na, nb = a.norm(dim=-1), b.norm(dim=-1)  # [C, H]
    chosen = torch.zeros(C * H, dtype=torch.bool, device=a.device)
    chosen[(na * nb).flatten().topk(planes).indices] = True
    chosen = chosen.view(C, H)
    slot = chosen.long().cumsum(-1) - 1  # plane index of each chosen head within its frequency
    onehot = (slot[..., None] == torch.arange(H, device=a.device)) & chosen[..., None]  # [C, H (head), H (plane)]
    scale = onehot.to(a.dtype)
    mixing = scale * (na * nb)[..., None].to(a.dtype)
    query = rearrange(a / na[..., None].clamp(min=1e-30), "c h D -> c D h") @ scale
    key = rearrange(b / nb[..., None].clamp(min=1e-30), "c h D -> c D h") @ scale
    return onehot.any(1), mixing, query, key


def _als(a: torch.Tensor, b: torch.Tensor, start: tuple, iterations: int, tol: float):
    """Complex ALS from ``start`` (``block_start``'s tuple), keeping the best sweep per frequency; ``tol > 0``
    stops when the total relative error improves by less (a host read per sweep)."""
    active, mixing, query, key = start
    mixing, query, key = _normalise(mixing, query, key)
    err2 = _errors2(a, b, mixing, query, key)
    total = (a.abs().square().sum(-1) * b.abs().square().sum(-1)).sum().clamp(min=1e-30)
    done = 0
    for done in range(1, iterations + 1):
        cm = mixing.conj()
        q = _solve(_gram(mixing, key), a.transpose(1, 2) @ (cm * _hdot(b, key)), active)
        k = _solve(_gram(mixing, q), b.transpose(1, 2) @ (cm * _hdot(a, q)), active)
        m = _solve(_gram(q, k), _hdot(a, q) * _hdot(b, k), active)
        m, q, k = _normalise(m, q, k)
        new = _errors2(a, b, m, q, k)
        better = new <= err2  # per frequency
        keep = better[:, None, None]
        mixing, query, key = (torch.where(keep, x, y) for x, y in ((m, mixing), (q, query), (k, key)))
        gain = (err2.sum() - torch.where(better, new, err2).sum()) / total
        err2 = torch.where(better, new, err2)
        if tol > 0 and bool(gain < tol):
            break
    return (active, mixing, query, key), err2, done


def decompose_rotary(P: torch.Tensor, K: torch.Tensor, rank: int, *, iterations: int = 20, tol: float = 1e-6,
                     covariance: tuple[torch.Tensor, torch.Tensor] | None = None,
                     ridge: float = 1e-2) -> RotaryDecomposition:
    """Rotary collaborative factors of width ``rank`` (even) for query weights ``P[H, d, D]`` and key weights
    ``K[G, d, D]`` (grouped-query attention: query head ``h`` reads key head ``h // (H/G)``). Complex float64
    (float32 on MPS, which has no float64)."""
    H, d, _ = P.shape
    real = torch.float32 if P.device.type == "mps" else torch.float64
    cdtype = torch.complex64 if real == torch.float32 else torch.complex128
    K = K.repeat_interleave(H // K.shape[0], dim=0)
    a0, b0 = complex_planes(P, real).conj(), complex_planes(K, real)  # [C, H, D]
    a, b = a0, b0
    if covariance is not None:
        (Lq, Lq_inv_t), (Lk, Lk_inv_t) = (whitening(c.to(real), ridge) for c in covariance)
        a, b = a0 @ Lq.to(cdtype), b0 @ Lk.to(cdtype)
    planes = min(rank // 2, H * (d // 2))
    start = block_start(a, b, planes)
    (active, mixing, query, key), err2, done = (start, _errors2(a, b, *start[1:]), 0) if rank >= H * d else \
        _als(a, b, start, iterations, tol)
    total = (a.abs().square().sum(-1) * b.abs().square().sum(-1)).sum().clamp(min=1e-30)
    error = (err2.sum() / total).sqrt()
    if covariance is not None:
        query, key = Lq_inv_t.to(cdtype) @ query, Lk_inv_t.to(cdtype) @ key
    weight2 = _errors2(a0, b0, mixing, query, key).sum()
    weight_total = (a0.abs().square().sum(-1) * b0.abs().square().sum(-1)).sum().clamp(min=1e-30)
    if rank >= H * d:  # the block form is exact: 0, not the rounding of ‖T‖² − 2⟨T, T̂⟩ + ‖T̂‖²
        error, weight2 = error.new_zeros(()), weight2.new_zeros(())
    # the used planes, frequency by frequency: [C, n] → [R/2]
    frequency = torch.arange(active.shape[0], device=P.device)[:, None].expand_as(active)
    order = torch.argsort((~active).flatten().to(torch.uint8), stable=True)[:planes]  # no data-dependent shape
    pick = lambda x: rearrange(x, "c ... n -> (c n) ...")[order]  # noqa: E731
    factors = RotaryFactors(frequency.flatten()[order], pick(mixing).T, pick(query).T, pick(key).T)
    return RotaryDecomposition(factors, error, (weight2 / weight_total).sqrt(), done)
