"""One merged key/value head for a group of query heads, and the q/o compensation that goes with it.

Keys. Rotary sites: per frequency pair a shared complex functional and a complex scalar per member
(:func:`fit.shared_pairs`, weighted by the member query's energy in that pair), the scalar moved into the query
(:func:`rotary.conjugate_rows`). Other sites: a shared ``d``-row key (reduced-rank regression of the members'
keys, weighted by their query covariance) and per-member ``C_h`` moved into the query (``q' = C_hᵀ q``).
Values: a shared ``d``-row value explaining every member's output ``W_o^h v_h`` and per-member output maps
``W_o'^h`` by least squares. Scores and per-head outputs are matched on ``Σ``; the softmax in between is not.

Both compensations are ``[d, d]`` maps of a member's own rows (``q' = A q``, ``W_o' = W_o B``), so a fit keeps
only them and the merged key/value rows: the new query and output tensors are built when the site is changed
(:class:`Compensation`), and a whole-model conversion never holds every site's new q and o at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .fit import regress, shared_pairs, shared_rows, shared_rows_of_gram
from .rotary import conjugate_rows, to_complex, to_real
from .weights import SiteWeights


@dataclass
class Compensation:
    """What a merge does to its members (query-head indices, in group order): query maps ``q_map[m, d, d]``
    (``q' = A q``) and output maps ``o_map[m, d, d]`` (``W_o' = W_o B``); ``None``: unchanged."""

    members: list[int]
    q_map: torch.Tensor | None = None
    o_map: torch.Tensor | None = None

    def query_rows(self, w: SiteWeights) -> torch.Tensor:
        """The members' new query rows ``[m, d, n]`` from today's (``w.q``)."""
        q = w.q[self.members]
        return q if self.q_map is None else self.q_map @ q

    def output_columns(self, w: SiteWeights) -> torch.Tensor:
        """The members' new output columns ``[m, D_out, d]`` from today's (``w.o``)."""
        o = w.o[self.members]
        return o if self.o_map is None else o @ self.o_map


@dataclass
class Merged:
    """A group's new key and value rows ``[d, n]`` and what the merge does to its members."""

    k: torch.Tensor
    v: torch.Tensor
    compensation: Compensation


def energy(rows: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """Per-row ``E[(w x)²]`` of ``rows[..., d, n]``."""
    return torch.einsum("...dn,nk,...dk->...d", rows, sigma, rows)


def merge_group(w: SiteWeights, members: list[int], init: str, sigma: torch.Tensor, rotary: bool,
                ridge: float) -> Merged:
    """Fit the group ``members`` (query-head indices); ``sigma`` is ``E[x xᵀ]`` (identity for ``init="svd"``)."""
    sources = [w.source(h) for h in members]
    q, o = w.q[members], w.o[members]
    k, v = w.k[sources], w.v[sources]
    if len(set(sources)) == 1:  # the members already share one key/value head: nothing to merge
        return Merged(k[0].clone(), v[0].clone(), Compensation(members))
    if init == "mean":
        return Merged(k.mean(0), v.mean(0), Compensation(members))
    d = k.shape[1]
    eye = torch.eye(d, dtype=torch.float64)
    if rotary:
        q_energy = energy(q, sigma)  # [m, d]
        pair_weight = (q_energy[:, : d // 2] + q_energy[:, d // 2:]).clamp(min=0).sqrt()
        shared, scale = shared_pairs(to_complex(k), pair_weight, sigma, ridge)
        new_k = to_real(shared)
        q_map = torch.stack([conjugate_rows(eye, scale[i]) for i in range(len(members))])  # c̄ ⊙ as a [d, d] map
    else:
        cov = q @ sigma @ q.mT  # [m, d, d]
        lower = torch.linalg.cholesky(cov + 1e-9 * cov.diagonal(dim1=-2, dim2=-1).mean(-1)[:, None, None] * eye)
        new_k = shared_rows((lower.mT @ k).flatten(0, 1), sigma, d, ridge)
        q_map = torch.stack([regress(k[i], new_k, sigma, ridge) for i in range(len(members))]).mT  # [m, d, d]
    # the members' outputs W_o^h v_h ([m·D_out, n]) only through their Gram matrix: Σ_h v_hᵀ (W_o^hᵀ W_o^h) v_h
    gram = v.flatten(0, 1).mT @ (o.mT @ o @ v).flatten(0, 1)  # [n, n], no [m, n, n]
    new_v = shared_rows_of_gram(gram, sigma, d, ridge)
    # W_o v ≈ E P (regress) with E = W_o·R, R = v Σ Pᵀ (P Σ Pᵀ)⁻¹: a [d, d] map of the member's own output columns
    o_map = torch.stack([regress(v[i], new_v, sigma, ridge) for i in range(len(members))])
    return Merged(new_k, new_v, Compensation(members, q_map, o_map))
