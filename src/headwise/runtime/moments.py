"""Second moments of what every attention site reads, over a calibration set: one pass of the model, padding
excluded (``site_moments(model, sites, batches, keys=True) -> {site.path: SiteMoments}``). Every weight fit that
only needs input statistics (KV conversion, collaborative heads) starts here.

Per site and per real token: ``xx = E[x xᵀ]`` and ``x = E[x]`` of the query-side inputs ``x [D]`` (the decoder's
tokens for decoder sites of an encoder-decoder, read with the ``decoder_attention_mask``), and, with ``keys=True``,
``kk``: the second moment of the key-side inputs centred per sequence (not centred at rotary sites, where a term
constant over keys still varies with position); in cross-attention (``dec-enc``) the key side is the encoder's
output (``key_value_states``, real where the ``attention_mask`` is). A module shared by several layers (ALBERT)
pools every layer. Sums run in float64 on the inputs' device (float32 on MPS, which has no float64).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
from torch import nn

from ..progress import progress_bar
from ..sites import AttentionSite


def moment_dtype(device: torch.device) -> torch.dtype:
    """float64 where the device has it (MPS has no float64: float32 there)."""
    return torch.float32 if device.type == "mps" else torch.float64


@dataclass
class SiteMoments:
    """One site's averages per real token: ``xx [D, D]``, ``x [D]``, ``kk [D, D]`` (None unless ``keys``) and the
    number of real query tokens seen (``tokens``)."""

    xx: torch.Tensor
    x: torch.Tensor
    kk: torch.Tensor | None
    tokens: int


class _Sums:
    """Running sums of one site (see the module docstring)."""

    def __init__(self, dim: int, keys: bool) -> None:
        self.dim, self.keys = dim, keys
        self.xx = self.x = self.kk = self.count = self.key_count = None
        self.tokens = 0  # real query tokens, counted on the host (no device sync, and meta tensors have no values)

    def add(self, x: torch.Tensor, real: torch.Tensor, keys: torch.Tensor | None, key_real: torch.Tensor | None,
            centre: bool) -> None:
        """Query-side ``x [B, T, D]`` with ``real [B, T]`` bool; key-side ``keys [B, S, D]`` with ``key_real``
        (None: the query side, self-attention)."""
        dtype = moment_dtype(x.device)
        if self.xx is None:
            zeros = dict(dtype=dtype, device=x.device)
            self.xx, self.kk = torch.zeros(self.dim, self.dim, **zeros), torch.zeros(self.dim, self.dim, **zeros)
            self.x, self.count, self.key_count = torch.zeros(self.dim, **zeros), torch.zeros((), **zeros), \
                torch.zeros((), **zeros)
        x, w = x.detach().to(dtype), real.to(device=x.device, dtype=dtype)[..., None]
        xr = (x * w).flatten(0, 1)
        self.xx += xr.T @ xr
        self.x += xr.sum(0)
        self.count += w.sum()
        if not self.keys:
            return
        if keys is not None:
            x, w = keys.detach().to(dtype), key_real.to(device=x.device, dtype=dtype)[..., None]
        xr = x * w
        centred = (x - xr.sum(1, keepdim=True) / w.sum(1, keepdim=True).clamp(min=1)) * w if centre else xr
        self.kk += centred.flatten(0, 1).T @ centred.flatten(0, 1)
        self.key_count += w.sum()

    def result(self, device: torch.device) -> SiteMoments:
        if self.xx is None:  # a site the calibration never reached: zero moments, as an empty sum
            self.add(torch.zeros(1, 1, self.dim, device=device), torch.zeros(1, 1, dtype=torch.bool), None, None,
                     True)
        count = self.count.clamp(min=1)
        kk = self.kk / self.key_count.clamp(min=1) if self.keys else None
        return SiteMoments(self.xx / count, self.x / count, kk, self.tokens)


def _real(batch: dict, decoder_side: bool, shape: torch.Size) -> torch.Tensor:
    """``[B, T]`` bool real tokens of the side a site reads, from the batch as given (all when it has no mask of
    that shape)."""
    mask = batch.get("decoder_attention_mask") if decoder_side and "decoder_input_ids" in batch \
        else batch.get("attention_mask")
    if not torch.is_tensor(mask) or mask.shape != shape:
        return torch.ones(shape, dtype=torch.bool)
    return mask.bool()


@torch.no_grad()
def site_moments(model: nn.Module, sites: list[AttentionSite], calibration: Iterable[dict | torch.Tensor],
                 keys: bool = False, progress: bool | None = None) -> dict[str, SiteMoments]:
    """``{site.path: SiteMoments}`` from running ``model`` on ``calibration``: model-input dicts or ``[B, T]``
    tensors of input ids."""
    sums = {s.path: _Sums(s.hidden_size, keys) for s in sites}
    current: dict[str, dict] = {}

    def hook(site: AttentionSite):
        decoder_side = site.kind != "enc-self"

        def capture(module, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            batch = current["batch"]
            real = _real(batch, decoder_side, x.shape[:2])
            cross = kwargs.get("key_value_states") if site.kind == "dec-enc" else None
            cross_real = None if cross is None else _real(batch, False, cross.shape[:2])
            sums[site.path].add(x, real, cross, cross_real, centre=site.positions != "rotary")
            sums[site.path].tokens += int(real.sum())
        return capture

    handles = [s.module.register_forward_pre_hook(hook(s), with_kwargs=True) for s in sites]
    device = next(model.parameters()).device
    try:
        for batch in progress_bar(calibration, desc="calibration", unit="batch",
                                  disable=None if progress is None else not progress):
            batch = {"input_ids": batch} if torch.is_tensor(batch) else dict(batch)
            current["batch"] = batch  # masks as given: counted where they are (the tokenizer's host tensors)
            model(**{k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()})
    finally:
        for handle in handles:
            handle.remove()
    return {path: s.result(device) for path, s in sums.items()}
