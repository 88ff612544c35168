"""Random projections shared by Performer, RFA and Scatterbrain: orthogonal Gaussian blocks from a seed."""

from __future__ import annotations

import torch


def orthogonal_gaussian(heads: int, features: int, dim: int, generator: torch.Generator) -> torch.Tensor:
    """``[heads, features, dim]``: rows orthogonal within blocks of ``dim`` and with chi-distributed norms, so each
    row is marginally ``N(0, I)`` (Choromanski et al., 2021)."""
    out = []
    for _ in range(heads):
        blocks, left = [], features
        while left > 0:
            qmat, r = torch.linalg.qr(torch.randn(dim, dim, generator=generator))
            qmat = qmat * torch.sign(torch.diagonal(r))  # Haar-distributed (QR alone biases the signs)
            blocks.append(qmat.T[: min(left, dim)])
            left -= dim
        norms = torch.randn(features, dim, generator=generator).norm(dim=1, keepdim=True)
        out.append(torch.cat(blocks) * norms)
    return torch.stack(out)


class RandomProjection(torch.nn.Module):
    """Holds ``omega [H, m, d]`` as a buffer (saved, so a reload is exact) and redraws it on request.

    ``redraw_interval > 0``: draw fresh features every that many training forwards (Performer's redrawing).
    """

    def __init__(self, heads: int, features: int, dim: int, seed: int, redraw_interval: int = 0) -> None:
        super().__init__()
        self.heads, self.features, self.dim, self.seed = heads, features, dim, seed
        self.redraw_interval, self.calls, self.draws = redraw_interval, 0, 0
        self.register_buffer("omega", self._draw())

    def _draw(self) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.draws)
        return orthogonal_gaussian(self.heads, self.features, self.dim, generator)

    def get(self, training: bool) -> torch.Tensor:
        if training and self.redraw_interval:
            self.calls += 1
            if self.calls % self.redraw_interval == 0:
                self.draws += 1
                self.omega.copy_(self._draw().to(self.omega))
        return self.omega
