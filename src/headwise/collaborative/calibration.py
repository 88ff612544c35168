"""Input statistics of every attention site on a calibration set, for the data-aware objective.

For the scores ``S_h = X A_h Xᵀ`` the error a softmax sees is ``Σ ‖X (A_h − Â_h) (X − 1 x̄ᵀ)ᵀ‖²`` (terms
constant over keys cancel), i.e. ``tr(Eᵀ C_q E C_k)`` with ``C_q = Σ x xᵀ`` over query tokens and ``C_k`` the
covariance of key tokens centred per sequence. Padding is excluded (decoder sites of an encoder-decoder use the
``decoder_attention_mask``); a shared module (ALBERT) pools every layer.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch
from torch import nn
from tqdm.auto import tqdm

from ..errors import HeadwiseError
from ..sites import AttentionSite


class _Moments:
    def __init__(self, dim: int) -> None:
        self.query = torch.zeros(dim, dim, dtype=torch.float64)
        self.key = torch.zeros(dim, dim, dtype=torch.float64)
        self.tokens = 0

    def add(self, x: torch.Tensor, real: torch.Tensor) -> None:
        """``x[B, T, D]``, ``real[B, T]`` bool."""
        x, w = x.detach().double().cpu(), real.double().cpu()[..., None]
        xr = x * w
        self.query += xr.flatten(0, 1).T @ xr.flatten(0, 1)
        centred = (x - xr.sum(1, keepdim=True) / w.sum(1, keepdim=True).clamp(min=1)) * w
        self.key += centred.flatten(0, 1).T @ centred.flatten(0, 1)
        self.tokens += int(real.sum())


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
    """``{site.path: (C_q, C_k)}`` (float64, averaged per token) from running ``model`` on ``calibration``:
    texts (with ``tokenizer``) or an iterable of model-input dicts. Raises if it holds fewer tokens than the
    hidden size (the covariances would be singular)."""
    if calibration is None or (isinstance(calibration, (list, tuple)) and not len(calibration)):
        raise HeadwiseError("the calibration set is empty; pass texts (or model-input batches) the model will see")
    moments = {s.path: _Moments(s.hidden_size) for s in sites}
    real: dict[str, torch.Tensor] = {}  # real tokens of the encoder ("source") and decoder ("target") inputs

    def hook(site: AttentionSite):
        side = "source" if site.kind == "enc-self" else "target"

        def capture(module, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            mask = real[side] if real[side].shape == x.shape[:2] else torch.ones(x.shape[:2], dtype=torch.bool)
            moments[site.path].add(x, mask)
        return capture

    handles = [s.module.register_forward_pre_hook(hook(s), with_kwargs=True) for s in sites]
    device = next(model.parameters()).device
    bar = tqdm(desc="calibration", unit="batch", disable=None if progress is None else not progress)
    try:
        for batch in _batches(calibration, tokenizer, batch_size, max_length):
            batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
            first = next(v for v in batch.values() if torch.is_tensor(v))
            mask = batch.get("attention_mask")
            real["source"] = mask.bool().cpu() if mask is not None else torch.ones(first.shape[:2], dtype=torch.bool)
            real["target"] = real["source"]
            if "decoder_input_ids" in batch:  # an encoder-decoder: decoder sites see the target side
                target = batch.get("decoder_attention_mask")
                real["target"] = target.bool().cpu() if target is not None else \
                    torch.ones(batch["decoder_input_ids"].shape[:2], dtype=torch.bool)
            model(**batch)
            bar.update()
    finally:
        for handle in handles:
            handle.remove()
        bar.close()
    dim = sites[0].hidden_size
    tokens = max(m.tokens for m in moments.values())
    if tokens < dim:
        raise HeadwiseError(f"the calibration set is too short: {tokens} tokens, but the data-aware objective needs "
                            f"at least {dim} (the hidden size) to estimate input covariances; pass more text "
                            "(a few hundred sentences is plenty), or drop the calibration set for the weight objective")
    return {p: (m.query / max(m.tokens, 1), m.key / max(m.tokens, 1)) for p, m in moments.items()}
