"""cosFormer (Qin et al., 2022): ReLU features with a cos-based re-weighting of distance.

``s(i, j) = relu(q_i)ᵀ relu(k_j) · cos(π (i − j) / 2M)`` decomposes with ``cos(a − b) = cos a cos b + sin a sin b``
into features ``[relu(x) cos(π i / 2M), relu(x) sin(π i / 2M)]`` (size 2d), so it runs as linear attention, causal
or not. The paper sets ``M`` to the sequence length; ``max_length = 0`` does that in a full forward, and decoding,
whose final length is unknown, needs a fixed ``max_length``. Positions count padded tokens too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..errors import HeadwiseError
from .base import MechanismConfig, positive, register
from .kernel import Features, KernelMechanism


@dataclass
class CosFormerConfig(MechanismConfig):
    max_length: int = field(default=0, metadata={"help": "M of the re-weighting (0: the sequence length; decoding "
                                                         "needs a fixed M)"})

    def check(self) -> None:
        positive("max_length", self.max_length, 0)


@register
class CosFormer(KernelMechanism):
    """ReLU features with cos re-weighting of the distance; O(T d²)."""

    name = "cosformer"
    config_class = CosFormerConfig
    complexity = "O(T d²)"

    def features(self, q, k, keep, causal, scale, start=0):
        t = q.shape[2]
        m = self.config.max_length or t
        angle = (torch.arange(t, device=q.device, dtype=q.dtype) + start) * (math.pi / (2 * m))
        cos, sin = angle.cos()[:, None], angle.sin()[:, None]
        return Features(*(torch.cat([F.relu(x) * cos, F.relu(x) * sin], dim=-1) for x in (q, k)))

    def decode(self, q, k, v, keep, state, scale):
        if not self.config.max_length:
            raise HeadwiseError("cosformer: decoding needs a fixed max_length (M depends on the final length)")
        return super().decode(q, k, v, keep, state, scale)
