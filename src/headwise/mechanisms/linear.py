"""Linear attention (Katharopoulos et al., 2020): feature map ``elu(x) + 1``, no softmax."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F

from .base import MechanismConfig, register
from .kernel import KernelMechanism


@dataclass
class LinearConfig(MechanismConfig):
    pass


@register
class Linear(KernelMechanism):
    """``φ(x) = elu(x) + 1`` on queries and keys (the scale is not used); O(T d²)."""

    name = "linear"
    config_class = LinearConfig
    complexity = "O(T d²)"

    def features(self, q, k, keep, causal, scale):
        return F.elu(q) + 1, F.elu(k) + 1
