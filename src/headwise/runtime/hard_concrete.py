"""Voita et al.'s Hard-Concrete head gates (reference-methods §A.2–A.3), a stochastic ``Gate``.

Training sample (one draw per head per forward, shared by the batch)::

    u ~ U(ε, 1−ε),  s = σ((log u − log(1−u) + log α) / β),  g = clip(s·(ζ−γ) + γ, 0, 1)

Evaluation gate (no noise, *no temperature*): ``g = clip(σ(log α)·(ζ−γ) + γ, 0, 1)``, exactly 0 iff
``log α ≤ ln(−γ/ζ)`` (≈ −2.398 with the defaults). Probability that a gate is open (Louizos et al.):
``P_open = σ(log α − β·ln(−γ/ζ))``, clipped to ``[ε, 1−ε]``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..errors import HeadwiseError
from .defaults import EPS, STRETCH, TEMPERATURE
from .gates import Gate
from .ops import HeadOp


class HardConcreteGate(Gate, HeadOp):
    """A stochastic per-head gate with parameter ``log_alpha [H]``. ``forward(out[B, T, H, d])``.

    ``init``: ``"voita"`` draws ``log α ~ U(±sqrt(3/H))`` as the reference code (eval gates start near 0.5);
    a number starts every head at that ``log α`` (e.g. 3.0: gates start open, ``P_open ≈ 0.98``).
    """

    op_type = "hard_concrete"

    def __init__(self, num_heads: int, temperature: float = TEMPERATURE, stretch: tuple[float, float] = STRETCH,
                 eps: float = EPS, init: str | float = "voita") -> None:
        super().__init__()
        low, high = stretch
        if not (low < 0 and high > 1):
            raise HeadwiseError(f"stretch limits must satisfy γ < 0 < 1 < ζ, got {stretch}")
        if temperature <= 0:
            raise HeadwiseError(f"temperature must be > 0, got {temperature}")
        self.temperature, self.stretch, self.eps, self.init = temperature, (float(low), float(high)), eps, init
        if init == "voita":
            bound = math.sqrt(3.0 / num_heads)
            start = torch.empty(num_heads).uniform_(-bound, bound)
        elif isinstance(init, (int, float)):
            start = torch.full((num_heads,), float(init))
        else:
            raise HeadwiseError(f"init must be 'voita' or a number (the starting log alpha), got {init!r}")
        self.log_alpha = nn.Parameter(start)

    def spec(self) -> dict:
        return {"num_heads": self.log_alpha.numel(), "temperature": self.temperature, "stretch": list(self.stretch),
                "eps": self.eps, "init": self.init}

    def select_heads(self, keep: torch.Tensor) -> None:
        self.log_alpha = nn.Parameter(self.log_alpha.detach()[keep.to(self.log_alpha.device)].clone())

    def _stretch(self, s: torch.Tensor) -> torch.Tensor:
        low, high = self.stretch
        return (s * (high - low) + low).clamp(0.0, 1.0)

    def sample(self) -> torch.Tensor:
        """A training-time gate vector ``[H]`` (differentiable in ``log_alpha``)."""
        u = torch.empty_like(self.log_alpha).uniform_(self.eps, 1.0 - self.eps)
        return self._stretch(torch.sigmoid((u.log() - (-u).log1p() + self.log_alpha) / self.temperature))

    def eval_gates(self) -> torch.Tensor:
        """The deterministic gate vector ``[H]`` used at evaluation."""
        return self._stretch(torch.sigmoid(self.log_alpha))

    def p_open(self) -> torch.Tensor:
        """``P(g_h ≠ 0)`` per head ``[H]``, the expected-L0 terms."""
        low, high = self.stretch
        shift = self.temperature * math.log(-low / high)
        return torch.sigmoid(self.log_alpha - shift).clamp(self.eps, 1.0 - self.eps)

    def values(self) -> torch.Tensor:
        return self.sample() if self.training else self.eval_gates()

    def inference(self) -> torch.Tensor:
        return self.eval_gates()
