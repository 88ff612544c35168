"""LARA (Zheng et al., ICML 2022): randomized attention made linear with multiple importance sampling.

Softmax attention is an expectation over ``ω`` of ``f(ω) = Σ_m ξ(ω, k_m) v_m / Σ_m ξ(ω, k_m)`` with positive
features ``ξ(ω, x) = exp(ωᵀx − |x|²/2)``. LARA takes one ``ω_c`` from each of ``C`` proposals ``N(μ_c, I)`` centred
at ``μ_c = q̄_c + k̄_c`` (segment means of scaled queries and keys, real tokens only; ``proposal="learned"`` first
maps queries and keys through a trained Linear + LayerNorm, the paper's ``adaptive-1d``) and combines the samples
with self-normalised weights, a softmax over proposals:
``out(q) = Σ_c softmax_c(log α_c(q) + ω_cᵀq + log Σ_m ξ(ω_c, k_m) − log q_c(ω_c)) β_c``,
``β_c = Σ_m softmax_m(ω_cᵀk_m − |k_m|²/2) v_m``. ``mis="bh"``: balance heuristic (``α = 1``,
``q_c`` the mixture of all proposals). ``mis="opt"`` (the paper's default): ``q_c = N(μ_c, I)`` and
``α_c(q) = bh_c + a·(t_c(q) − mean_c t_c(q))`` with ``bh_c`` the balance-heuristic weight of ``ω_c``,
``t_c(q) = softmax_c(q̄_cᵀq)`` and ``a = alpha_coeff`` (2.0 in the paper), clamped at 1e-8.
Training samples ``ω_c = μ_c + ε`` (``redraw`` policy, generator on the input's device); evaluation uses
``ω_c = μ_c`` as the paper does (``eval_noise=True``: the latest draw instead). Not causal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import HeadwiseError
from .base import Mechanism, keep_or_ones, neg_fill, positive, register
from .nystrom import segment_means
from .randomness import POLICIES, Draws, RandomConfig


@dataclass
class LARAConfig(RandomConfig):
    redraw: str = field(default="every_step", metadata={"help": "when training draws fresh proposal samples",
                                                                "choices": POLICIES})
    num_landmarks: int = field(default=64, metadata={"help": "number of proposals C (segment landmarks)"})
    mis: str = field(default="opt", metadata={"help": "multiple importance sampling weights: opt (the paper's "
                                                      "default) or bh (balance heuristic)", "choices": ("opt", "bh")})
    alpha_coeff: float = field(default=2.0, metadata={"help": "mis=opt: weight a of the query-dependent term"})
    proposal: str = field(default="mean", metadata={"help": "proposal means: mean (segment means, no parameters) or "
                                                            "learned (Linear + LayerNorm, adaptive-1d)",
                                                    "choices": ("mean", "learned")})
    eval_noise: bool = field(default=False, metadata={"help": "sample ω in evaluation too (default: ω = μ)"})

    def check(self) -> None:
        super().check()
        positive("num_landmarks", self.num_landmarks)
        if self.mis not in ("opt", "bh"):
            raise HeadwiseError(f"lara: mis must be 'opt' or 'bh', got {self.mis!r}")
        if self.proposal not in ("mean", "learned"):
            raise HeadwiseError(f"lara: proposal must be 'mean' or 'learned', got {self.proposal!r}")


class Adaptive(nn.Module):
    """Linear (identity at start) + LayerNorm over the head dimension: the trained map of queries or keys before
    pooling; runs in the dtype of its input (float32 for half models)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear, self.norm = nn.Linear(dim, dim), nn.LayerNorm(dim)
        nn.init.eye_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.linear(x, self.linear.weight.to(x.dtype), self.linear.bias.to(x.dtype))
        return F.layer_norm(x, x.shape[-1:], self.norm.weight.to(x.dtype), self.norm.bias.to(x.dtype))


@register
class LARA(Mechanism):
    """Multiple-importance-sampled random-feature attention with adaptive proposals; O(T C d); not causal."""

    name = "lara"
    config_class = LARAConfig
    complexity = "O(T C d)"
    can_be_causal = False

    def __init__(self, num_heads: int, head_dim: int, **args) -> None:
        super().__init__(num_heads, head_dim, **args)
        self.draws = Draws(self.config)
        learned = self.config.proposal == "learned"
        self.q_map, self.k_map = (Adaptive(head_dim), Adaptive(head_dim)) if learned else (None, None)

    def attend(self, q, k, v, keep, causal, scale):
        cfg = self.config
        padded = keep is not None
        keep = keep_or_ones(keep, q)
        self.draws.step(self.training)
        # q' = q·√scale and k' = k·√scale. Without learned maps the factor r = √scale commutes with the means and
        # the products, so it scales the [C, d] summaries instead of the [T, d] queries and keys.
        r = scale ** 0.5
        if self.q_map is not None:  # the learned maps act on q' and k' themselves
            q, k, r = q * r, k * r, 1.0
        qm, km = (q, k) if self.q_map is None else (self.q_map(q), self.k_map(k))
        c = min(cfg.num_landmarks, q.shape[2])
        ql, valid = segment_means(qm, keep, c)
        kl, _ = segment_means(km, keep, c)
        ql, kl = ql * r, kl * r  # means of q', k' (or of their maps)
        mu = ql + kl  # [b, h, C, d]
        omega = mu
        if self.training or cfg.eval_noise:
            omega = mu + torch.randn(mu.shape, generator=self.draws.generator(mu.device), device=mu.device,
                                     dtype=mu.dtype)
        fill = neg_fill(q.dtype)
        # masks enter as additive biases fused into the matmuls (no pass over [T, C] or [C, T] of their own)
        off = torch.zeros_like(valid, dtype=q.dtype).masked_fill(~valid, fill)[:, None, None, :]  # [b, 1, 1, C]
        log_proj_mu = omega @ mu.transpose(-1, -2) - mu.pow(2).sum(-1)[..., None, :] / 2  # [b, h, C(ω), C'(μ)]
        log_mix = torch.logsumexp(log_proj_mu + off, -1)  # [b, h, C]
        key_bias = k.pow(2).sum(-1) * (-r * r / 2)  # [b, h, T]: −|k'|²/2
        if padded:
            key_bias = key_bias.masked_fill(~keep[:, None, :], fill)
        omega_r = omega * r  # ωᵀk' = (ω r)ᵀk, and the same for queries
        logits = badd(key_bias[:, :, None, :], omega_r, k.transpose(-1, -2))  # [b, h, C, T]
        log_norm = torch.logsumexp(logits, -1)  # [b, h, C]: log Σ_m ξ(ω_c, k_m)
        beta = (logits - log_norm[..., None]).exp() @ v  # [b, h, C, d]
        if cfg.mis == "bh":  # log target − log mixture proposal
            return badd((log_norm - log_mix)[:, :, None, :] + off, q, omega_r.transpose(-1, -2)).softmax(-1) @ beta
        log_own = torch.diagonal(log_proj_mu, dim1=-2, dim2=-1)  # [b, h, C]
        t = badd(off, q, (ql * r).transpose(-1, -2)).softmax(-1)  # [b, h, T, C], sums to 1 over the valid proposals
        t_mean = 1 / valid.sum(-1).clamp_min(1).to(q.dtype)  # [b]: the mean of t over them
        shift = (log_own - log_mix).exp() - cfg.alpha_coeff * t_mean[:, None, None]  # [b, h, C]
        alpha = torch.add(shift[:, :, None, :], t, alpha=cfg.alpha_coeff)  # bh + a · (t − mean t)
        scores = badd((log_norm - log_own)[:, :, None, :] + off, q, omega_r.transpose(-1, -2))
        return (scores + alpha.clamp_min(1e-8).log()).softmax(-1) @ beta


def badd(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``bias + a @ b`` in one batched GEMM: ``a [B, H, n, k]``, ``b [B, H, k, p]``, ``bias`` broadcastable to
    ``[B, H, 1, p]`` → ``[B, H, n, p]``."""
    batch, heads = a.shape[:2]
    bias = bias.expand(batch, heads, 1, b.shape[-1]).reshape(batch * heads, 1, b.shape[-1])
    return torch.baddbmm(bias, a.flatten(0, 1), b.flatten(0, 1)).unflatten(0, (batch, heads))
