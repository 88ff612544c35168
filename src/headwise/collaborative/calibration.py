"""Input statistics of every attention site on a calibration set, for the data-aware objective.

For the scores ``S_h = X A_h Xᵀ`` the error a softmax sees is ``Σ ‖X (A_h − Â_h) (X − 1 x̄ᵀ)ᵀ‖²`` (terms
constant over keys cancel), i.e. ``tr(Eᵀ C_q E C_k)`` with ``C_q = Σ x xᵀ`` over query tokens and ``C_k`` the
covariance of key tokens centred per sequence (not centred at rotary sites: under rotation a term constant
over keys still varies with position): the ``xx`` and ``kk`` of ``headwise.runtime.site_moments`` (padding
excluded; in cross-attention the keys are the encoder's output tokens).
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Sequence

import torch
from torch import nn

from ..errors import HeadwiseError
from ..runtime.moments import moments_in_groups, site_moments
from ..sites import AttentionSite


def _batches(calibration: Sequence[str] | Iterable[dict], tokenizer: Any, batch_size: int, max_length: int):
    if isinstance(calibration, (list, tuple)) and calibration and isinstance(calibration[0], str):
        if tokenizer is None:
            raise HeadwiseError("a calibration set of texts needs the tokenizer: compress(..., tokenizer=tokenizer)")
        for start in range(0, len(calibration), batch_size):
            yield tokenizer(list(calibration[start : start + batch_size]), padding=True, truncation=True,
                            max_length=max_length, return_tensors="pt")
    else:
        yield from calibration


def _checked(moments: dict, sites: list[AttentionSite]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    dim = sites[0].hidden_size
    seen = max(m.tokens for m in moments.values())
    if seen < dim:
        raise HeadwiseError(f"the calibration set is too short: {seen} tokens, but the data-aware objective needs "
                            f"at least {dim} (the hidden size) to estimate input covariances; pass more text "
                            "(a few hundred sentences is plenty), or drop the calibration set for the weight objective")
    return {path: (m.xx, m.kk) for path, m in moments.items()}


def _nonempty(calibration: Sequence[str] | Iterable[dict] | None) -> None:
    if calibration is None or (isinstance(calibration, (list, tuple)) and not len(calibration)):
        raise HeadwiseError("the calibration set is empty; pass texts (or model-input batches) the model will see")


def input_moments(model: nn.Module, sites: list[AttentionSite], calibration: Sequence[str] | Iterable[dict],
                  tokenizer: Any = None, batch_size: int = 32, max_length: int = 128,
                  progress: bool | None = None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{site.path: (C_q, C_k)}`` (float64, on the model's device, averaged per token) from running ``model`` on
    ``calibration``: texts (with ``tokenizer``) or an iterable of model-input dicts (``runtime.site_moments``
    with the key side). Raises if it holds fewer tokens than the hidden size (the covariances would be
    singular). Every site's at once: ``input_moments_in_groups`` reads them a group at a time."""
    _nonempty(calibration)
    moments = site_moments(model, sites, _batches(calibration, tokenizer, batch_size, max_length), keys=True,
                           progress=progress)
    return _checked(moments, sites)


def input_moments_in_groups(model: nn.Module, sites: list[AttentionSite], calibration: Sequence[str] | Iterable[dict],
                            tokenizer: Any = None, batch_size: int = 32, max_length: int = 128,
                            progress: bool | None = None
                            ) -> Iterator[tuple[list[AttentionSite], dict[str, tuple[torch.Tensor, torch.Tensor]]]]:
    """``(group, input_moments of the group)`` for groups of ``sites`` in turn (``runtime.moments_in_groups``: one
    calibration pass a group, its moments within a share of the weights' bytes)."""
    _nonempty(calibration)
    batches = list(_batches(calibration, tokenizer, batch_size, max_length))
    for group, moments in moments_in_groups(model, sites, batches, keys=True, progress=progress):
        checked = _checked(moments, group)
        yield group, checked
        checked.clear()  # consumed (see runtime.moments_in_groups)
