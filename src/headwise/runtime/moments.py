"""Second moments of what every attention site reads, over a calibration set: one pass of the model, padding
excluded (``site_moments(model, sites, batches, keys=True) -> {site.path: SiteMoments}``). Every weight fit that
only needs input statistics (KV conversion, collaborative heads) starts here.

Per site and per real token: ``xx = E[x xᵀ]`` and ``x = E[x]`` of the query-side inputs ``x [D]`` (the decoder's
tokens for decoder sites of an encoder-decoder, read with the ``decoder_attention_mask``), and, with ``keys=True``,
``kk``: the second moment of the key-side inputs centred per sequence (not centred at rotary sites, where a term
constant over keys still varies with position); in cross-attention (``dec-enc``) the key side is the encoder's
output (``key_value_states``, real where the ``attention_mask`` is). A module shared by several layers (ALBERT)
pools every layer. Sums run in float64 on the inputs' device (float32 on MPS, which has no float64).

A site's sums are ``D × D`` values in float64: over every site, a third of float32 weights (two thirds of
bfloat16 ones). ``moments_in_groups`` therefore reads the sites a group at a time, one calibration pass per group
with the group's sums within ``MOMENTS_SHARE`` of the weights' bytes, and a fit consumes each group before the
next is read. A pass stops once it has read every site of its group (the layers after it, and the output head's
vocabulary-sized logits, are never computed), fills no key/value cache (``compat.no_cache``), and runs each
batch in slices of examples whose forward stays within ``FORWARD_SHARE`` of the weights (``slices``; the sums are
the whole batch's up to rounding): a decoder's MLP holds four ``[B, T, I]`` tensors at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import torch
from torch import nn

from ..allocator import trim
from ..compat import no_cache
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
            self.xx = torch.zeros(self.dim, self.dim, **zeros)
            self.kk = torch.zeros(self.dim, self.dim, **zeros) if self.keys else None
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
        count = self.count.clamp(min=1)  # averaged in place: the sums are not held twice
        kk = self.kk.div_(self.key_count.clamp(min=1)) if self.keys else None
        return SiteMoments(self.xx.div_(count), self.x.div_(count), kk, self.tokens)


def _real(batch: dict, decoder_side: bool, shape: torch.Size) -> torch.Tensor:
    """``[B, T]`` bool real tokens of the side a site reads, from the batch as given (all when it has no mask of
    that shape)."""
    mask = batch.get("decoder_attention_mask") if decoder_side and "decoder_input_ids" in batch \
        else batch.get("attention_mask")
    if not torch.is_tensor(mask) or mask.shape != shape:
        return torch.ones(shape, dtype=torch.bool)
    return mask.bool()


class _Read(Exception):
    """Raised by the last site a pass needs: the rest of the forward is not computed."""


FORWARD_SHARE = 1 / 32  # of the weights' bytes: what one calibration forward's transient tensors may take
MIN_SLICE_TOKENS = 512  # a slice holds at least this many positions (or one example): tiny models keep their batches


def slice_size(model: nn.Module, batch: int, length: int) -> int:
    """Examples per forward of a ``[batch, length]`` calibration batch: the per-token transient of a layer (the
    larger of the MLP's ``4·I`` and the attention's ``8·D`` elements) times the slice's tokens within
    ``FORWARD_SHARE`` of the weights, at least ``MIN_SLICE_TOKENS`` positions."""
    params, config = list(model.parameters()), getattr(model, "config", None)
    hidden = getattr(config, "hidden_size", None) or getattr(config, "d_model", None) or 0
    inner = getattr(config, "intermediate_size", None) or getattr(config, "decoder_ffn_dim", None) or 4 * hidden
    per_token = max(4 * inner, 8 * hidden) * params[0].element_size()
    if not per_token:
        return batch
    tokens = max(MIN_SLICE_TOKENS, int(FORWARD_SHARE * sum(p.numel() * p.element_size() for p in params)) // per_token)
    return max(1, min(batch, tokens // max(1, length)))


def slices(model: nn.Module, batch: dict) -> Iterator[dict]:
    """``batch`` in pieces of ``slice_size`` examples, read off its first ``[B, T, …]`` tensor (every tensor whose
    first dimension is ``B`` is cut); whole when it has none."""
    ids = next((v for v in batch.values() if torch.is_tensor(v) and v.dim() >= 2), None)
    if ids is None:
        yield batch
        return
    count, size = ids.shape[0], slice_size(model, ids.shape[0], ids.shape[1])
    for start in range(0, count, size):
        yield {k: v[start:start + size] if torch.is_tensor(v) and v.dim() and v.shape[0] == count else v
               for k, v in batch.items()}


@torch.no_grad()
def site_moments(model: nn.Module, sites: list[AttentionSite], calibration: Iterable[dict | torch.Tensor],
                 keys: bool = False, progress: bool | None = None) -> dict[str, SiteMoments]:
    """``{site.path: SiteMoments}`` from running ``model`` on ``calibration``: model-input dicts or ``[B, T]``
    tensors of input ids. Each forward stops once every site has read its input (unless a module serves several
    layers, ALBERT's, which reads again)."""
    sums = {s.path: _Sums(s.hidden_size, keys) for s in sites}
    current: dict[str, dict] = {}
    stop = not any(s.shared for s in sites)

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
            current["read"].add(site.path)
            if stop and len(current["read"]) == len(sums):
                raise _Read
        return capture

    handles = [s.module.register_forward_pre_hook(hook(s), with_kwargs=True) for s in sites]
    device, extra = next(model.parameters()).device, no_cache(model)
    try:
        for batch in progress_bar(calibration, desc="calibration", unit="batch",
                                  disable=None if progress is None else not progress):
            batch = {"input_ids": batch} if torch.is_tensor(batch) else dict(batch)
            for part in slices(model, batch):
                current["batch"], current["read"] = part, set()  # masks as given: counted where they are
                try:
                    model(**{**extra, **{k: v.to(device) if torch.is_tensor(v) else v for k, v in part.items()}})
                except _Read:
                    pass
    finally:
        for handle in handles:
            handle.remove()
    return {path: s.result(device) for path, s in sums.items()}


MOMENTS_SHARE = 1 / 16  # of the weights' bytes: what one group's running sums may take


def moment_groups(model: nn.Module, sites: Sequence[AttentionSite], keys: bool = False,
                  share: float = MOMENTS_SHARE) -> list[list[AttentionSite]]:
    """``sites`` in consecutive groups whose sums (``D × D`` float64, twice with ``keys``) take at most ``share``
    of the model's weights' bytes each (at least one site a group)."""
    limit = share * sum(p.numel() * p.element_size() for p in model.parameters())
    groups: list[list[AttentionSite]] = [[]]
    held = 0.0
    for site in sites:
        size = (2 if keys else 1) * (site.hidden_size + 1) ** 2 * 8
        if groups[-1] and held + size > limit:
            groups.append([])
            held = 0.0
        groups[-1].append(site)
        held += size
    return [g for g in groups if g]


def moments_in_groups(model: nn.Module, sites: Sequence[AttentionSite], calibration: Sequence[dict | torch.Tensor],
                      keys: bool = False, progress: bool | None = None, share: float = MOMENTS_SHARE
                      ) -> Iterator[tuple[list[AttentionSite], dict[str, SiteMoments]]]:
    """``(group, site_moments of the group)`` for each of ``moment_groups(model, sites, keys, share)`` in turn (one
    calibration pass each; ``calibration`` is read once per group): a consumer that fits a group's sites before
    asking for the next never holds more than one group's sums: the dict it was given is emptied when it asks.
    After each pass the freed heap goes back to the system (``allocator.trim``)."""
    for group in moment_groups(model, sites, keys, share):
        found = site_moments(model, group, calibration, keys, progress)
        trim()  # the pass's activations and the last group's fits are freed: their heap pages go back
        yield group, found
        found.clear()  # the consumer is done with the group: its sums go before the next group's pass
