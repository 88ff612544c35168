"""Second moments ``E[x xᵀ]`` of the input of every attention site on a calibration set.

Every fit of this package needs only these moments: a key, query or value is a linear function of the site's
input ``x`` (augmented with a constant 1 when the projections have biases), so its energy and its error under any
linear map are quadratic forms in ``E[x xᵀ]`` (``headwise.runtime.moments``: padding excluded).
"""

from __future__ import annotations

from typing import Iterable, Iterator, Sequence

import torch
from torch import nn

from ..errors import HeadwiseError
from ..runtime.moments import SiteMoments, moments_in_groups, site_moments
from ..sites import AttentionSite


def has_bias(site: AttentionSite) -> bool:
    return any(getattr(p.module, "bias", None) is not None for p in (site.q, site.k, site.v))


def _fit_moments(moments: dict[str, SiteMoments], sites: Sequence[AttentionSite]) -> dict[str, torch.Tensor]:
    """``{site.path: E[x xᵀ]}`` (float64 on the CPU, augmented with the constant 1 where the site has biases) of
    ``site_moments``' results; refuses fewer tokens per site than the hidden size."""
    tokens = min((m.tokens for m in moments.values()), default=0)
    need = sites[0].hidden_size
    if tokens < need:
        raise HeadwiseError(f"the calibration set holds {tokens} tokens per site, fewer than the hidden size {need}: "
                            "pass more text (a few thousand tokens), or use init='svd' (weight space, no data)")
    out = {}
    for site in sites:
        m = moments.pop(site.path)
        xx, x = m.xx.double().cpu(), m.x.double().cpu()
        if has_bias(site):  # E[[x; 1][x; 1]ᵀ] = [[E xxᵀ, E x], [E xᵀ, 1]]
            xx = torch.cat([torch.cat([xx, x[:, None]], 1), torch.cat([x, x.new_ones(1)])[None]], 0)
        out[site.path] = xx
    return out


@torch.no_grad()
def input_moments(model: nn.Module, sites: list[AttentionSite], calibration: Iterable[dict | torch.Tensor],
                  progress: bool | None = None) -> dict[str, torch.Tensor]:
    """``{site.path: E[x xᵀ]}`` (float64 on the CPU, ``[D(+1), D(+1)]``: ``x`` augmented with a 1 when the
    site's projections have biases) from running ``model`` on ``calibration``: model-input dicts or ``[B, T]``
    tensors of input ids (``runtime.site_moments``). Every site's at once: to fit site by site within a small
    memory margin, use ``input_moments_in_groups``."""
    return _fit_moments(site_moments(model, sites, calibration, progress=progress), sites)


def moments_by_group(model: nn.Module, sites: list[AttentionSite], calibration: Iterable[dict | torch.Tensor] | None,
                     moments: dict[str, torch.Tensor] | None = None, progress: bool | None = None
                     ) -> Iterator[tuple[list[AttentionSite], dict[str, torch.Tensor]]]:
    """``(group of sites, their input moments)`` as a fit reads them: ``moments`` given (every site's, computed
    once by ``input_moments``), none without ``calibration`` (weight-space fits), else ``input_moments`` of groups
    of sites in turn (``runtime.moments_in_groups``: one calibration pass a group, its moments within a share of
    the weights' bytes), so a fit that consumes a group before asking for the next never holds every site's. The
    dict is the consumer's: it may ``pop`` each site's moments as it fits it (``moments`` given stays whole)."""
    if moments is not None:
        if any(s.path not in moments for s in sites):
            raise HeadwiseError("moments lack some sites; compute them with "
                                "headwise.conversion.input_moments(model, sites, batches)")
        yield sites, dict(moments)
    elif calibration is None:
        yield sites, {}
    else:
        batches = calibration if isinstance(calibration, (list, tuple)) else list(calibration)
        for group, found in moments_in_groups(model, sites, batches, progress=progress):
            fitted = _fit_moments(found, group)
            yield group, fitted
            fitted.clear()  # consumed (see moments_in_groups)
