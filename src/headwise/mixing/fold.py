"""Fold alpha matrices into the output projection after training: a plain model, no extra cost at inference.

``y = Σ_i W^O_i Z'_i = Σ_i W^O_i Σ_j α_ij Z_j = Σ_j (Σ_i α_ij W^O_i) Z_j``, so ``W^O_j ← Σ_i α_ij W^O_i``
(``site.o.weight [H, out, d]``), the mixer is detached, and a ``fold_mixing`` record goes into
``config.headwise`` (its replay on reload only checks that the sites exist: the folded weights are in the file).
"""

from __future__ import annotations

import torch
from einops import einsum
from torch import nn

from ..errors import HeadwiseError
from ..contract import record
from ..runtime.ops import detach, ops_of
from ..sites import recorded_sites
from .alpha import MIXER_NAME, mixers_of

EDIT_KIND = "fold_mixing"


@torch.no_grad()
def fold_mixing(model: nn.Module) -> nn.Module:
    """Fold every attached ``HeadMixer`` into its site's output projection and detach it; returns the model.

    The mixer must be the last output op of its site (an op after it would act on mixed heads).
    """
    found = mixers_of(model)
    if not found:
        raise HeadwiseError("the model has no alpha mixers to fold")
    for site, _ in found:
        names = list(ops_of(site).output)
        if names[-1] != MIXER_NAME:
            raise HeadwiseError(f"{site.name}: output op {names[-1]!r} runs after the mixer; fold or detach it first")
    norms = {}
    for site, mixer in found:
        alpha = mixer.alpha.detach().double()
        o = site.o.weight
        o.copy_(einsum(alpha, o.double(), "i j, i o d -> j o d").to(o.dtype))
        norms[site.path] = round(float(torch.linalg.matrix_norm(alpha, ord="nuc")), 6)
        detach(site, MIXER_NAME)
    record(model, "mixing", None, {"sites": list(norms), "nuclear_norms": norms})
    return model


def replay_fold(model: nn.Module, entry: dict) -> None:
    """A journal entry of folded mixers only checks that its sites exist (the folded weights are in the file)."""
    recorded_sites(model, entry["state"]["sites"], f"edit {EDIT_KIND}")
