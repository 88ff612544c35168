"""Second moments ``E[x xᵀ]`` of the input of every attention site on a calibration set.

Every fit of this package needs only these moments: a key, query or value is a linear function of the site's
input ``x`` (augmented with a constant 1 when the projections have biases), so its energy and its error under any
linear map are quadratic forms in ``E[x xᵀ]`` (``headwise.runtime.moments``: padding excluded).
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from ..errors import HeadwiseError
from ..runtime.moments import site_moments
from ..sites import AttentionSite


def has_bias(site: AttentionSite) -> bool:
    return any(getattr(p.module, "bias", None) is not None for p in (site.q, site.k, site.v))


@torch.no_grad()
def input_moments(model: nn.Module, sites: list[AttentionSite], calibration: Iterable[dict | torch.Tensor],
                  progress: bool | None = None) -> dict[str, torch.Tensor]:
    """``{site.path: E[x xᵀ]}`` (float64 on the CPU, ``[D(+1), D(+1)]``: ``x`` augmented with a 1 when the
    site's projections have biases) from running ``model`` on ``calibration``: model-input dicts or ``[B, T]``
    tensors of input ids (``runtime.site_moments``)."""
    moments = site_moments(model, sites, calibration, progress=progress)
    tokens = min((m.tokens for m in moments.values()), default=0)
    need = sites[0].hidden_size
    if tokens < need:
        raise HeadwiseError(f"the calibration set holds {tokens} tokens per site, fewer than the hidden size {need}: "
                            "pass more text (a few thousand tokens), or use init='svd' (weight space, no data)")
    out = {}
    for site in sites:
        m = moments[site.path]
        xx, x = m.xx.double().cpu(), m.x.double().cpu()
        if has_bias(site):  # E[[x; 1][x; 1]ᵀ] = [[E xxᵀ, E x], [E xᵀ, 1]]
            xx = torch.cat([torch.cat([xx, x[:, None]], 1), torch.cat([x, x.new_ones(1)])[None]], 0)
        out[site.path] = xx
    return out
