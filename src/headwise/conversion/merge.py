"""One merged key/value head for a group of query heads, and the q/o compensation that goes with it.

Keys. Rotary sites: per frequency pair a shared complex functional and a complex scalar per member
(:func:`fit.shared_pairs`, weighted by the member query's energy in that pair), the scalar moved into the query
(:func:`rotary.conjugate_rows`). Other sites: a shared ``d``-row key (reduced-rank regression of the members'
keys, weighted by their query covariance) and per-member ``C_h`` moved into the query (``q' = C_hᵀ q``).
Values: a shared ``d``-row value explaining every member's output ``W_o^h v_h`` and per-member output maps
``W_o'^h`` by least squares. Scores and per-head outputs are matched on ``Σ``; the softmax in between is not.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .fit import regress, shared_pairs, shared_rows
from .rotary import conjugate_rows, to_complex, to_real
from .weights import SiteWeights


@dataclass
class Merged:
    """A group's new key and value rows ``[d, n]`` and its members' new query rows ``[m, d, n]`` and output
    columns ``[m, D_out, d]`` (members in group order)."""

    k: torch.Tensor
    v: torch.Tensor
    q: torch.Tensor
    o: torch.Tensor


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
        return Merged(k[0], v[0], q, o)
    if init == "mean":
        return Merged(k.mean(0), v.mean(0), q, o)
    d = k.shape[1]
    if rotary:
        q_energy = energy(q, sigma)  # [m, d]
        pair_weight = (q_energy[:, : d // 2] + q_energy[:, d // 2:]).clamp(min=0).sqrt()
        shared, scale = shared_pairs(to_complex(k), pair_weight, sigma, ridge)
        new_k = to_real(shared)
        new_q = torch.stack([conjugate_rows(q[i], scale[i]) for i in range(len(members))])
    else:
        eye = torch.eye(d, dtype=torch.float64)
        cov = q @ sigma @ q.mT  # [m, d, d]
        lower = torch.linalg.cholesky(cov + 1e-9 * cov.diagonal(dim1=-2, dim2=-1).mean(-1)[:, None, None] * eye)
        new_k = shared_rows((lower.mT @ k).flatten(0, 1), sigma, d, ridge)
        maps = torch.stack([regress(k[i], new_k, sigma, ridge) for i in range(len(members))])  # [m, d, d]
        new_q = maps.mT @ q
    outputs = o @ v  # [m, D_out, n]
    new_v = shared_rows(outputs.flatten(0, 1), sigma, d, ridge)
    new_o = torch.stack([regress(outputs[i], new_v, sigma, ridge) for i in range(len(members))])
    return Merged(new_k, new_v, new_q, new_o)
