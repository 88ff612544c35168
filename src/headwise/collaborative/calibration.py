"""Input statistics of every attention site on a calibration set, for the data-aware objective.

For the scores ``S_h = X A_h Xᵀ`` the error a softmax sees is ``Σ ‖X (A_h − Â_h) (X − 1 x̄ᵀ)ᵀ‖²`` (terms
constant over keys cancel), i.e. ``tr(Eᵀ C_q E C_k)`` with ``C_q = Σ x xᵀ`` over query tokens and ``C_k`` the
covariance of key tokens centred per sequence (not centred at rotary sites: under rotation a term constant
over keys still varies with position). Padding is excluded (decoder sites of an encoder-decoder use the
``decoder_attention_mask``); in cross-attention (``dec-enc``) the queries are the decoder's tokens and the keys
the encoder's output tokens (``key_value_states``, real where the ``attention_mask`` is); a shared module (ALBERT)
pools every layer.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch
from torch import nn

from ..errors import HeadwiseError
from ..progress import progress_bar
from ..sites import AttentionSite


def moment_dtype(device: torch.device) -> torch.dtype:
    """float64 where the device has it (MPS has no float64: float32 there)."""
    return torch.float32 if device.type == "mps" else torch.float64


class _Moments:
    """Running ``Σ x xᵀ`` of query tokens and of per-sequence centred key tokens, kept on the inputs' device."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.query: torch.Tensor | None = None
        self.key: torch.Tensor | None = None
        self.count: torch.Tensor | None = None  # real query tokens seen, 0-dim on the inputs' device
        self.key_count: torch.Tensor | None = None  # real key tokens seen

    def add(self, x: torch.Tensor, real: torch.Tensor, keys: torch.Tensor | None = None,
            key_real: torch.Tensor | None = None, centre: bool = True) -> None:
        """Query tokens ``x[B, T, D]``, ``real[B, T]`` bool (any device: moved to ``x``'s); key tokens
        ``keys[B, S, D]``, ``key_real[B, S]`` (default: the query tokens, self-attention); ``centre=False``
        keeps the keys' mean (rotary sites, where a term constant over keys still changes with position)."""
        dtype = moment_dtype(x.device)
        if self.query is None:
            self.query = torch.zeros(self.dim, self.dim, dtype=dtype, device=x.device)
            self.key = torch.zeros(self.dim, self.dim, dtype=dtype, device=x.device)
            self.count = torch.zeros((), dtype=dtype, device=x.device)
            self.key_count = torch.zeros((), dtype=dtype, device=x.device)
        x, w = x.detach().to(dtype), real.to(device=x.device, dtype=dtype)[..., None]
        xr = x * w
        self.query += xr.flatten(0, 1).T @ xr.flatten(0, 1)
        self.count += w.sum()
        if keys is not None:
            x, w = keys.detach().to(dtype), key_real.to(device=x.device, dtype=dtype)[..., None]
            xr = x * w
        centred = (x - xr.sum(1, keepdim=True) / w.sum(1, keepdim=True).clamp(min=1)) * w if centre else xr
        self.key += centred.flatten(0, 1).T @ centred.flatten(0, 1)
        self.key_count += w.sum()


def _real_tokens(mask: torch.Tensor | None, ids: torch.Tensor) -> int:
    """Real tokens of one batch, read from the mask where the batch came from (the tokenizer's CPU tensors: no
    device sync); all of ``ids[B, T]`` without a mask."""
    return int(mask.sum()) if mask is not None else ids.shape[0] * ids.shape[1]


def _batches(calibration: Sequence[str] | Iterable[dict], tokenizer: Any, batch_size: int, max_length: int):
    if isinstance(calibration, (list, tuple)) and calibration and isinstance(calibration[0], str):
        if tokenizer is None:
            raise HeadwiseError("a calibration set of texts needs the tokenizer: compress(..., tokenizer=tokenizer)")
        for start in range(0, len(calibration), batch_size):
            yield tokenizer(list(calibration[start : start + batch_size]), padding=True, truncation=True,
                            max_length=max_length, return_tensors="pt")
    else:
        yield from calibration


@torch.no_grad()
def input_moments(model: nn.Module, sites: list[AttentionSite], calibration: Sequence[str] | Iterable[dict],
                  tokenizer: Any = None, batch_size: int = 32, max_length: int = 128,
                  progress: bool | None = None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{site.path: (C_q, C_k)}`` (float64, on the model's device, averaged per token) from running ``model`` on
    ``calibration``: texts (with ``tokenizer``) or an iterable of model-input dicts. Raises if it holds fewer tokens
    than the hidden size (the covariances would be singular)."""
    if calibration is None or (isinstance(calibration, (list, tuple)) and not len(calibration)):
        raise HeadwiseError("the calibration set is empty; pass texts (or model-input batches) the model will see")
    moments = {s.path: _Moments(s.hidden_size) for s in sites}
    real: dict[str, torch.Tensor] = {}  # real tokens of the encoder ("source") and decoder ("target") inputs
    counts: dict[str, int] = {}  # their numbers in the current batch
    tokens = dict.fromkeys(moments, 0)  # real tokens each site saw (a shared module: every layer's)

    def hook(site: AttentionSite):
        side = "source" if site.kind == "enc-self" else "target"

        def mask_of(x: torch.Tensor, which: str) -> torch.Tensor:
            matched = real[which].shape == x.shape[:2]
            return real[which] if matched else torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)

        def capture(module, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            matched = real[side].shape == x.shape[:2]
            keys = kwargs.get("key_value_states") if site.kind == "dec-enc" else None
            moments[site.path].add(x, mask_of(x, side), keys, None if keys is None else mask_of(keys, "source"),
                                   centre=site.positions != "rotary")
            tokens[site.path] += counts[side] if matched else x.shape[0] * x.shape[1]
        return capture

    handles = [s.module.register_forward_pre_hook(hook(s), with_kwargs=True) for s in sites]
    device = next(model.parameters()).device
    bar = progress_bar(desc="calibration", unit="batch", disable=None if progress is None else not progress)
    try:
        for batch in _batches(calibration, tokenizer, batch_size, max_length):
            given = next(v for v in batch.values() if torch.is_tensor(v))
            counts["source"] = counts["target"] = _real_tokens(batch.get("attention_mask"), given)
            if "decoder_input_ids" in batch:
                counts["target"] = _real_tokens(batch.get("decoder_attention_mask"), batch["decoder_input_ids"])
            batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
            first = next(v for v in batch.values() if torch.is_tensor(v))
            mask = batch.get("attention_mask")
            real["source"] = mask.bool() if mask is not None else \
                torch.ones(first.shape[:2], dtype=torch.bool, device=first.device)
            real["target"] = real["source"]
            if "decoder_input_ids" in batch:  # an encoder-decoder: decoder sites see the target side
                target = batch.get("decoder_attention_mask")
                real["target"] = target.bool() if target is not None else \
                    torch.ones(batch["decoder_input_ids"].shape[:2], dtype=torch.bool, device=first.device)
            model(**batch)
            bar.update()
    finally:
        for handle in handles:
            handle.remove()
        bar.close()
    dim = sites[0].hidden_size
    seen = max(tokens.values())
    if seen < dim:
        raise HeadwiseError(f"the calibration set is too short: {seen} tokens, but the data-aware objective needs "
                            f"at least {dim} (the hidden size) to estimate input covariances; pass more text "
                            "(a few hundred sentences is plenty), or drop the calibration set for the weight objective")
    for m in moments.values():
        if m.query is None:  # a site the calibration never reached: zero moments, as an empty sum
            m.add(torch.zeros(1, 1, m.dim, device=device), torch.zeros(1, 1, dtype=torch.bool, device=device))
    return {p: (m.query / m.count.clamp(min=1), m.key / m.key_count.clamp(min=1)) for p, m in moments.items()}
