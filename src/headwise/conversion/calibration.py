"""Second moments ``E[x xᵀ]`` of the input of every attention site on a calibration set.

Every fit of this package needs only these moments: a key, query or value is a linear function of the site's
input ``x`` (augmented with a constant 1 when the projections have biases), so its energy and its error under any
linear map are quadratic forms in ``E[x xᵀ]``. Padding is excluded (decoder self-attention of an encoder-decoder
uses the ``decoder_attention_mask``).
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from ..errors import HeadwiseError
from ..progress import progress_bar
from ..sites import AttentionSite


def augment(x: torch.Tensor, bias: bool) -> torch.Tensor:
    """``x[..., D]`` → ``[..., D+1]`` with a trailing 1 when ``bias`` (so biases are one more weight column)."""
    return torch.cat([x, x.new_ones(*x.shape[:-1], 1)], -1) if bias else x


def has_bias(site: AttentionSite) -> bool:
    return any(getattr(p.module, "bias", None) is not None for p in (site.q, site.k, site.v))


def _real(batch: dict, kind: str) -> torch.Tensor | None:
    mask = batch.get("decoder_attention_mask") if "decoder_input_ids" in batch and kind != "enc-self" \
        else batch.get("attention_mask")
    return None if mask is None else mask.bool()


@torch.no_grad()
def input_moments(model: nn.Module, sites: list[AttentionSite], calibration: Iterable[dict | torch.Tensor],
                  progress: bool | None = None) -> dict[str, torch.Tensor]:
    """``{site.path: E[x xᵀ]}`` (float64 on the CPU, ``[D(+1), D(+1)]``) from running ``model`` on
    ``calibration``: model-input dicts or ``[B, T]`` tensors of input ids."""
    sums = {s.path: None for s in sites}
    counts = dict.fromkeys(sums, 0)
    current: dict[str, dict] = {}

    def hook(site: AttentionSite):
        def capture(module, args, kwargs):
            x = (args[0] if args else kwargs["hidden_states"]).detach().double().cpu()
            real = _real(current["batch"], site.kind)
            real = real.cpu() if real is not None and real.shape == x.shape[:2] else torch.ones(x.shape[:2], dtype=torch.bool)
            x = augment(x[real], has_bias(site))
            sums[site.path] = x.T @ x + (0 if sums[site.path] is None else sums[site.path])
            counts[site.path] += x.shape[0]
        return capture

    handles = [s.module.register_forward_pre_hook(hook(s), with_kwargs=True) for s in sites]
    device = next(model.parameters()).device
    try:
        for batch in progress_bar(calibration, desc="calibration", unit="batch",
                                  disable=None if progress is None else not progress):
            batch = {"input_ids": batch} if torch.is_tensor(batch) else dict(batch)
            current["batch"] = batch
            model(**{k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()})
    finally:
        for handle in handles:
            handle.remove()
    tokens = min(counts.values()) if counts else 0
    need = sites[0].hidden_size
    if tokens < need:
        raise HeadwiseError(f"the calibration set holds {tokens} tokens per site, fewer than the hidden size {need}: "
                            "pass more text (a few thousand tokens), or use init='svd' (weight space, no data)")
    return {p: s / counts[p] for p, s in sums.items()}
