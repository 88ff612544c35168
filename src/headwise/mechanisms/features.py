"""Random projections shared by Performer, RFA and Scatterbrain: orthogonal Gaussian blocks, redrawn by policy."""

from __future__ import annotations

import torch
from torch import nn

from ..errors import HeadwiseError
from .randomness import Draws, RandomConfig


def orthogonal_gaussian(heads: int, features: int, dim: int, generator: torch.Generator,
                        device: torch.device | str = "cpu") -> torch.Tensor:
    """``[heads, features, dim]`` float32 on ``device``: rows orthogonal within blocks of ``dim`` and with
    chi-distributed norms, so each row is marginally ``N(0, I)`` (Choromanski et al., 2021)."""
    out = []
    for _ in range(heads):
        blocks, left = [], features
        while left > 0:
            qmat, r = torch.linalg.qr(torch.randn(dim, dim, generator=generator, device=device))
            qmat = qmat * torch.sign(torch.diagonal(r))  # Haar-distributed (QR alone biases the signs)
            blocks.append(qmat.T[: min(left, dim)])
            left -= dim
        norms = torch.randn(features, dim, generator=generator, device=device).norm(dim=1, keepdim=True)
        out.append(torch.cat(blocks) * norms)
    return torch.stack(out)


class RandomProjection(nn.Module):
    """Holds ``omega [H, m, d]`` (float32; a buffer, or a parameter when ``learn``) and redraws it by the policy.

    Saved with the model, so a reload is exact. Learned features start from the seed's draw and never redraw.
    """

    def __init__(self, heads: int, features: int, dim: int, config: RandomConfig, learn: bool = False) -> None:
        super().__init__()
        if learn and config.redraw != "fixed":
            raise HeadwiseError(f"learned random features cannot be redrawn: use redraw='fixed' "
                                f"(got redraw={config.redraw!r}) or learn_features=False")
        self.heads, self.features, self.dim = heads, features, dim
        self.draws = Draws(config)
        omega = self._draw(torch.device("cpu"))
        if learn:
            self.omega = nn.Parameter(omega)
        else:
            self.register_buffer("omega", omega)

    def _apply(self, fn, recurse=True):
        """``model.half()`` / ``.to(dtype)`` move a drawn (buffer) ``ω`` but keep it float32: features are computed
        in float32 anyway, and a rounded projection would be a different draw. Learned ``ω`` follows the model."""
        drawn = self._buffers.get("omega")
        super()._apply(fn, recurse)
        if drawn is not None and self._buffers["omega"].dtype != drawn.dtype:
            self._buffers["omega"] = drawn.to(self._buffers["omega"].device)
        return self

    def _draw(self, device: torch.device) -> torch.Tensor:
        return orthogonal_gaussian(self.heads, self.features, self.dim, self.draws.generator(device), device)

    def get(self, training: bool) -> torch.Tensor:
        """The current ``omega`` (redrawn on its own device when the policy says so)."""
        if self.draws.step(training):
            with torch.no_grad():
                self.omega.copy_(self._draw(self.omega.device))
        return self.omega
