"""Per-head projection weights of a site in float64, with biases as one more input column, and back."""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import SimpleNamespace

import torch
from torch import nn

from ..sites import AttentionSite, HeadProjection
from .calibration import has_bias


def _rows(proj: HeadProjection, bias: bool) -> torch.Tensor:
    """``[heads, d, D(+1)]`` float64 on the CPU."""
    w = proj.weight.detach().double().cpu()
    if not bias:
        return w
    b = proj.bias.detach().double().cpu()
    return torch.cat([w, b[..., None]], -1)


@dataclass
class SiteWeights:
    """``q[H, d, n]``, ``k``/``v[G, d, n]`` (``n = D+1`` when q/k/v have biases, last column = bias),
    ``o[H, D_out, d]``."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    bias: bool

    @classmethod
    def of(cls, site: AttentionSite) -> "SiteWeights":
        bias = has_bias(site)
        return cls(_rows(site.q, bias), _rows(site.k, bias), _rows(site.v, bias),
                   site.o.weight.detach().double().cpu(), bias)

    @property
    def group(self) -> int:
        return self.q.shape[0] // self.k.shape[0]

    def source(self, head: int) -> int:
        """The key/value head query head ``head`` reads today."""
        return head // self.group


def linear_from_rows(rows: torch.Tensor, bias: bool, like: nn.Module) -> nn.Linear:
    """A ``nn.Linear`` computing ``rows[out, n]`` (last column = bias when ``bias``) on ``like``'s device/dtype."""
    weight = rows[:, :-1] if bias else rows
    new = nn.Linear(weight.shape[1], weight.shape[0], bias=bias, device=like.weight.device, dtype=like.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(weight)
        if bias:
            new.bias.copy_(rows[:, -1])
    new.train(like.training)
    return new


@torch.no_grad()
def write_heads(proj: HeadProjection, rows: torch.Tensor, bias: bool) -> None:
    """Write ``rows`` (``[H, d, n]`` for q/k/v, ``[H, D_out, d]`` for o) into the projection in place."""
    target = proj.weight
    if proj.axis == "in":
        target.copy_(rows)
        return
    target.copy_(rows[..., :-1] if bias else rows)
    if bias:
        proj.bias.copy_(rows[..., -1])


def rewritten(proj: HeadProjection, rows: torch.Tensor, bias: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """New weight (and bias) tensors of ``proj``'s module with ``rows`` written at its heads (``write_heads``);
    the module and its tensors are left as they are (a fit builds every site's before it installs any)."""
    module = proj.module
    holder = SimpleNamespace(weight=module.weight.detach().clone(),
                             bias=None if module.bias is None else module.bias.detach().clone())
    write_heads(replace(proj, module=holder), rows, bias)
    return holder.weight, holder.bias


def rebind(module: nn.Module, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Give ``module`` new parameters holding ``weight`` (and ``bias``, when given): its old tensors are left to
    whoever shares them (e.g. the model a plan measures an edit on)."""
    for name, value in (("weight", weight), ("bias", bias)):
        if value is not None:
            setattr(module, name, nn.Parameter(value, requires_grad=getattr(module, name).requires_grad))
