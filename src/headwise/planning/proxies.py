"""The cheap proxy that ranks candidate edits before anything is measured on the task: the relative output error of
an edit applied in place on calibration batches (reconstruction / calibration error of a collaborative width, a
KV merge, a quantizer or a mechanism on one layer). It copies no model and leaves it as it was, bit for bit. (How
heads are ordered for removal is the ``rank`` hook of the method of role ``"heads"``.)"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from ..runtime import slices
from ..tasks.lm import final_hidden, logit_rows
from .edits import Edit, edited


@dataclass
class Outputs:
    """A model's outputs on calibration batches (float32), kept small: for a model whose logits are exactly
    ``head(hidden)`` (``tasks.lm.final_hidden``), the hidden states ``[B, T, D]`` its output embeddings ``head``
    read — the ``[B, T, V]`` logits are rebuilt chunk by chunk where they are compared; otherwise the logits
    (or last hidden states) themselves, and ``head`` is None."""

    values: list[torch.Tensor]
    head: nn.Module | None = None
    vocab: int = 0


def outputs(model: nn.Module, batches: Sequence[dict[str, torch.Tensor]]) -> Outputs:
    """The model's ``Outputs`` on ``batches``, each batch run in slices of examples (``runtime.slices``: a
    forward's transient within its share of the weights) and its slices' outputs joined."""
    head = model.get_output_embeddings()
    pieces: list[list[tuple[torch.Tensor, int | None]]] = []  # per batch: (hidden states and V, or logits and None)
    with torch.inference_mode():
        for b in batches:
            pieces.append([])
            for piece in slices(model, b):
                found = final_hidden(model, piece) if isinstance(head, nn.Module) else None
                if found is None:
                    y = model(**piece)
                    found = (y.logits if getattr(y, "logits", None) is not None else y[0], None)
                pieces[-1].append((found[0].float(), found[1]))
        vocabs = [v for batch in pieces for _, v in batch]
        if vocabs and None not in vocabs:
            return Outputs([torch.cat([h for h, _ in batch]) for batch in pieces], head, vocabs[0])
        return Outputs([torch.cat([x if v is None else _logits(x, head) for x, v in batch]) for batch in pieces])


def relative_error(reference: Outputs, got: Outputs) -> float:
    """``‖y − ŷ‖ / ‖y‖`` of the logits (or outputs) over all batches (padding positions included, identically
    on both sides). Through one plain ``nn.Linear`` head (weight ``W [V, D]``) both norms are quadratic forms of
    the hidden states in ``G = WᵀW`` (``head_gram``: ``[D, D]``, built once per head), so no ``[n, V]`` logits are
    built (``‖(a − b)Wᵀ‖² = (a − b) G (a − b)ᵀ``: the bias cancels); through another head the logits are rebuilt
    ``logit_rows`` positions at a time."""
    head = reference.head
    if head is not None and head is got.head and type(head) is nn.Linear and head.weight.device.type != "meta":
        return _error_by_gram(reference, got, head)
    num = den = 0.0
    with torch.inference_mode():
        for a, b in zip(reference.values, got.values):
            a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
            step = logit_rows(reference.vocab or got.vocab) if reference.head or got.head else len(a)
            for i in range(0, len(a), step):
                ya, yb = _logits(a[i : i + step], reference.head), _logits(b[i : i + step], got.head)
                num, den = num + float((ya - yb).pow(2).sum()), den + float(ya.pow(2).sum())
    return math.sqrt(num / max(den, 1e-30))


def _logits(values: torch.Tensor, head: nn.Module | None) -> torch.Tensor:
    """``values`` themselves, or the logits ``head`` makes of them (float32; ``values`` in the head's dtype)."""
    if head is None:
        return values
    weight = next(head.parameters(), None)
    return head(values if weight is None else values.to(weight.dtype)).float()


GRAM_ROWS = 8192  # rows of the head's weight per step of its Gram matrix (a [8192, D] float32 block at a time)
ERROR_ROWS = 256  # positions per step of the error's quadratic forms (a few [256, D] float64 blocks at a time)
_grams: "weakref.WeakKeyDictionary[nn.Linear, tuple[tuple[int, int], torch.Tensor, torch.Tensor]]" = \
    weakref.WeakKeyDictionary()


def head_gram(head: nn.Linear) -> tuple[torch.Tensor, torch.Tensor]:
    """``(G = WᵀW [D, D], Wᵀb [D])`` of a linear head in float64 (``Wᵀb`` zero without a bias), kept while the
    head lives and its weight is unchanged (the weight's version counter and storage are checked); built from
    ``GRAM_ROWS`` rows at a time, so no float64 copy of ``W`` is made."""
    w = head.weight
    key = (w.untyped_storage().data_ptr(), w._version)
    kept = _grams.get(head)
    if kept is not None and kept[0] == key:
        return kept[1], kept[2]
    with torch.inference_mode():
        gram = torch.zeros(w.shape[1], w.shape[1], dtype=torch.float64, device=w.device)
        cross = torch.zeros(w.shape[1], dtype=torch.float64, device=w.device)
        for i in range(0, w.shape[0], GRAM_ROWS):
            block = w[i : i + GRAM_ROWS].float()
            gram += (block.mT @ block).double()
            if head.bias is not None:
                cross += (block.mT @ head.bias[i : i + GRAM_ROWS].float()).double()
    _grams[head] = (key, gram, cross)
    return gram, cross


def _error_by_gram(reference: Outputs, got: Outputs, head: nn.Linear) -> float:
    """``relative_error`` through the linear ``head``: ``Σ dGdᵀ / Σ (aGaᵀ + 2a·Wᵀb + ‖b‖²)`` over positions,
    ``d = a − b``, in float64, ``ERROR_ROWS`` positions at a time."""
    gram, cross = head_gram(head)
    num = den = 0.0
    with torch.inference_mode():
        bias = 0.0 if head.bias is None else float(head.bias.double().pow(2).sum())
        for a, b in zip(reference.values, got.values):
            a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
            for i in range(0, len(a), ERROR_ROWS):
                x, y = (t[i : i + ERROR_ROWS].to(gram.device, torch.float64) for t in (a, b))
                d = x - y
                num += float(((d @ gram) * d).sum())
                den += float(((x @ gram) * x).sum() + 2 * (x @ cross).sum()) + bias * len(x)
    return math.sqrt(max(num, 0.0) / max(den, 1e-30))


def output_error(model: nn.Module, edit: Edit, batches: Sequence[dict[str, torch.Tensor]],
                 reference: Outputs | None = None,
                 calibration: Sequence[dict[str, torch.Tensor]] | None = None) -> float:
    """``relative_error`` of ``model`` with ``edit`` applied in place (``edits.edited``; restored exactly after)
    against ``reference`` (the unedited outputs on ``batches``, computed when not given)."""
    reference = reference if reference is not None else outputs(model, batches)
    with edited(model, edit, calibration):
        return relative_error(reference, outputs(model, batches))
