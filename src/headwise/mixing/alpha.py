"""Alpha mixing (MHR "Multi-Head Linear Mixing"): ``Z'_i = Σ_j α_ij Z_j`` on the per-head outputs, before the
output projection. One ``H × H`` matrix per site, initialised to the identity so attaching it changes nothing."""

from __future__ import annotations

import torch
from einops import einsum
from torch import nn

from ..runtime.attention import enable
from ..runtime.ops import HeadOp, attach, detach_all, ops_of
from ..sites import AttentionSite, find_sites
from .config import MixingConfig

MIXER_NAME = "mixer"


class HeadMixer(HeadOp):
    """``forward(out[B, Tq, H, d]) -> [B, Tq, H, d]`` with ``out'[..., i, :] = Σ_j alpha[i, j] · out[..., j, :]``.

    ``frozen`` (not saved) makes the forward use a detached ``alpha``: no gradient, so the optimizer leaves it
    alone, while it stays in the optimizer's parameter groups for when it thaws. A mixer cannot follow a head
    removal (``prune_heads`` refuses it): fold it first (``fold_mixing``).
    """

    op_type = "mixer"

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.eye(num_heads))
        self.frozen = False

    def spec(self) -> dict:
        return {"num_heads": self.alpha.shape[0]}

    def nuclear_norm(self) -> torch.Tensor:
        """``‖α‖_*`` (sum of singular values), differentiable, float32 or wider."""
        return torch.linalg.matrix_norm(self.alpha.float(), ord="nuc")

    def forward(self, out: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha.detach() if self.frozen else self.alpha
        return einsum(alpha.to(out.dtype), out, "i j, b t j d -> b t i d")


def add_mixers(model: nn.Module, config: MixingConfig | None = None) -> dict[str, HeadMixer]:
    """Attach an identity ``HeadMixer`` (named ``"mixer"``) to every site of ``config.kinds``; returns
    ``{site path: mixer}``, and select the ``headwise`` implementation so they run."""
    config = config or MixingConfig()
    mixers = {s.path: attach(s, "output", MIXER_NAME, HeadMixer(s.num_heads)) for s in config.sites(model)}
    enable(model)
    return mixers


def remove_mixers(model: nn.Module, missing_ok: bool = False) -> None:
    """Detach the mixers (undoes ``add_mixers``; ``fold_mixing`` keeps their effect in the weights instead);
    raises when there are none, unless ``missing_ok``."""
    detach_all(model, MIXER_NAME, missing_ok)


def mixers_of(model: nn.Module) -> list[tuple[AttentionSite, HeadMixer]]:
    """The attached mixers as ``(site, mixer)`` pairs, in site order."""
    found = []
    for s in find_sites(model):
        ops = ops_of(s)
        if ops is not None and MIXER_NAME in ops.output:
            found.append((s, ops.output[MIXER_NAME]))
    return found


@torch.no_grad()
def alpha_table(model: nn.Module) -> dict[str, dict]:
    """JSON-ready ``{site name: {"kind", "alpha": [[H] H], "nuclear_norm"}}`` of every mixer."""
    return {s.name: {"kind": s.kind, "alpha": m.alpha.detach().float().cpu().tolist(),
                     "nuclear_norm": float(m.nuclear_norm())} for s, m in mixers_of(model)}
