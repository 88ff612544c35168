"""``analyze_seq2seq``: every head of an encoder-decoder (``enc-self``, ``dec-self``, ``dec-enc``) on teacher-forced
source/target batches: Voita's roles and confidence (``head_roles``) next to Michel gradient importance of a
label loss.

Confidence is the mean largest attention weight of a head's real query rows (Voita et al.; for ``dec-enc``
it is how sharply a target token attends to one source token, the alignment-style confidence). Importance
is ``E|∂L/∂g_h|`` of the given per-example loss (e.g. ``Translation.loss``) at gates 1, each row divided by
its L2 norm, in the same (site, layer) row order as the roles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from ..errors import HeadwiseError
from .importance import LossFn, gradient_importance
from .roles import HeadRoles, RoleConfig, head_roles

SCORE_COLUMNS = ("confidence", "prev", "next", "rare", "alignment")


@dataclass
class Seq2SeqStats:
    """Roles and scores per (site, layer) row of every kind, and ``importance[row][head]`` (None: not computed)."""

    roles: HeadRoles
    importance: list[list[float]] | None

    def heads(self) -> list[dict[str, Any]]:
        """One record per head: ``kind``, ``layer``, ``head``, the role scores, ``importance``, ``roles``."""
        out = []
        for r, site in enumerate(self.roles.sites):
            for h, labels in enumerate(self.roles.roles[r]):
                record = {"kind": site["kind"], "layer": site["layers"][0], "head": h}
                record.update({name: self.roles.scores[name][r][h] for name in SCORE_COLUMNS})
                record["importance"] = None if self.importance is None else self.importance[r][h]
                record["roles"] = labels
                out.append(record)
        return out

    def rank_agreement(self) -> dict[str, float | None]:
        """Spearman correlation of confidence and gradient importance over the heads of each kind (None without
        importance or with fewer than 3 heads)."""
        out: dict[str, float | None] = {}
        heads = self.heads()
        for kind in dict.fromkeys(h["kind"] for h in heads):
            pairs = [(h["confidence"], h["importance"]) for h in heads if h["kind"] == kind
                     and h["confidence"] is not None and h["importance"] is not None]
            out[kind] = _spearman(*zip(*pairs)) if len(pairs) >= 3 else None
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"headwise_seq2seq_stats": 1, **self.roles.to_dict(), "importance_gradient": self.importance,
                "heads": self.heads(), "confidence_vs_importance_spearman": self.rank_agreement()}


def _spearman(a: Sequence[float], b: Sequence[float]) -> float:
    ra, rb = (torch.tensor(x, dtype=torch.float64).argsort().argsort().double() for x in (a, b))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()).clamp(min=1e-12))


def analyze_seq2seq(model: nn.Module, batches: Sequence[Mapping[str, torch.Tensor]], *,
                    loss_fn: LossFn | None = None, loss_inputs: Sequence[dict[str, torch.Tensor]] | None = None,
                    config: RoleConfig | None = None, counts: torch.Tensor | Mapping[int, int] | None = None,
                    progress: bool | None = None) -> Seq2SeqStats:
    """Roles and confidence of every head over ``batches`` (``input_ids``/``attention_mask`` plus teacher-forced
    ``decoder_input_ids``/``decoder_attention_mask``, e.g. ``Translation.calibration_inputs``; optional
    ``alignment``, see ``head_roles``), and gradient importance of ``loss_fn(model, batch) -> [B]`` over
    ``loss_inputs`` (collated batches with ``labels``) when both are given."""
    if not getattr(model.config, "is_encoder_decoder", False):
        raise HeadwiseError(f"analyze_seq2seq needs an encoder-decoder model, got {type(model).__name__}; use "
                            "headwise.analysis.analyze for encoders and decoders")
    if (loss_fn is None) != (loss_inputs is None):
        raise HeadwiseError("gradient importance needs both loss_fn(model, batch) -> [B] and loss_inputs")
    roles = head_roles(model, batches, config, counts)
    importance = None
    if loss_fn is not None:
        table = gradient_importance(model, None, loss_fn=loss_fn, inputs=loss_inputs, progress=progress,
                                    cross_attention=True)
        importance = [row[: len(roles.roles[r])] for r, row in enumerate(table.tolist())]
    return Seq2SeqStats(roles, importance)
