"""Linear attention with a deterministic feature map ``φ`` (no softmax): ``φ(q)ᵀ Σ φ(k) vᵀ / φ(q)ᵀ Σ φ(k)``.

``feature_map``: ``elu`` (Katharopoulos et al., 2020: ``elu(x) + 1``), ``relu`` (``max(x, 0)``, as the kernel of
cosFormer without its re-weighting) or ``dpfp`` (Schlag et al., 2021: deterministic parameter-free projection,
``x' = [relu(x), relu(−x)]``, ``φ(x) = [x' ⊙ roll(x', i)]_{i=1..ν}`` of size ``2dν``). The scale is not used.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..errors import HeadwiseError
from .base import MechanismConfig, positive, register
from .kernel import Features, KernelMechanism

MAPS = ("elu", "relu", "dpfp")


@dataclass
class LinearConfig(MechanismConfig):
    feature_map: str = field(default="elu", metadata={"help": "φ: elu (elu+1), relu or dpfp", "choices": MAPS})
    dpfp_nu: int = field(default=1, metadata={"help": "DPFP: number of rolls ν (features 2·d·ν)"})

    def check(self) -> None:
        if self.feature_map not in MAPS:
            raise HeadwiseError(f"linear: feature_map must be one of {', '.join(MAPS)}, got {self.feature_map!r}")
        positive("dpfp_nu", self.dpfp_nu)


def dpfp(x: torch.Tensor, nu: int) -> torch.Tensor:
    """``[..., d] -> [..., 2dν]``: DPFP features (Schlag et al., 2021)."""
    x = torch.cat([F.relu(x), F.relu(-x)], dim=-1)
    return torch.cat([x * x.roll(i, dims=-1) for i in range(1, nu + 1)], dim=-1)


@register
class Linear(KernelMechanism):
    """``φ(q)ᵀφ(k)`` attention with φ = elu+1, relu or DPFP; O(T d²)."""

    name = "linear"
    config_class = LinearConfig
    complexity = "O(T d²)"

    def features(self, q, k, keep, causal, scale, start=0):
        kind = self.config.feature_map
        if kind == "elu":
            return Features(F.elu(q) + 1, F.elu(k) + 1)
        if kind == "relu":
            return Features(F.relu(q), F.relu(k))
        return Features(dpfp(q, self.config.dpfp_nu), dpfp(k, self.config.dpfp_nu))
