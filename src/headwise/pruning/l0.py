"""L0 head pruning (Voita et al.): Hard-Concrete gates on chosen sites and the expected-L0 penalty.

``L0Config`` is what is attached (the gates); ``L0Training`` how they train.

``L_C = Σ_h P_open(h)``; ``reduction="sum"`` is the paper's form (sum over every gated head),
``"mean_over_modules"`` divides by the number of gated modules, as the reference code does (so its λ values,
e.g. 0.1, transfer). With ``target_heads`` the coefficient is not fixed: after every optimizer step it follows
dual ascent on the constraint ``E[open heads] ≤ target_t``, ``λ ← max(0, λ + lambda_lr·(E[open] − target_t)/N)``,
so it rises while too many heads are expected open and relaxes once the target is met. ``target_t`` moves
linearly from all ``N`` heads to ``target_heads`` over ``target_warmup`` steps: gates respond to λ with a lag of
tens of steps, and chasing a distant target from the first step makes λ overshoot until every gate is shut
(measured on MiniLM; closed Hard-Concrete gates get no task gradient and stay shut). ``l0_keep`` then keeps
exactly ``target_heads`` heads, those with the largest ``log α``.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import HeadwiseError
from ..runtime.attention import enable
from ..runtime.hard_concrete import HardConcreteGate
from ..runtime.ops import attach, attached, detach_all
from ..sites import find_sites
from .config import REDUCTIONS, L0Config, L0Training, Reduction  # noqa: F401  (defined without torch)

GATE_NAME = "l0"


def add_l0_gates(model: nn.Module, config: L0Config | None = None) -> dict[str, HardConcreteGate]:
    """Attach a ``HardConcreteGate`` (named ``"l0"``) to each selected site and select the ``headwise``
    implementation; returns ``{site path: gate}``."""
    config = config or L0Config()
    sites = config.sites(model)
    gates = {s.path: attach(s, "output", GATE_NAME, HardConcreteGate(
        s.num_heads, config.temperature, config.stretch, config.eps, config.init)) for s in sites}
    enable(model)
    return gates


def remove_l0_gates(model: nn.Module, missing_ok: bool = False) -> None:
    """Detach the L0 gates (undoes ``add_l0_gates``; ``prune_masked`` folds them into a smaller model instead);
    raises when there are none, unless ``missing_ok``."""
    detach_all(model, GATE_NAME, missing_ok)


def l0_gates(model: nn.Module) -> dict[str, HardConcreteGate]:
    """The attached L0 gates, ``{site path: gate}``."""
    return attached(model, "output", GATE_NAME)


def gate_table(model: nn.Module) -> dict[str, list[float]]:
    """Evaluation-time gate values per gated site, ``{site name: [H]}`` (a head is dead iff its value is 0)."""
    names = {s.path: s.name for s in find_sites(model)}
    return {names[p]: g.eval_gates().tolist() for p, g in l0_gates(model).items()}


class L0Penalty:
    """``λ · L_C`` over the model's L0 gates (a ``headwise.training.Penalty``), trained as ``training`` says."""

    def __init__(self, model: nn.Module, training: L0Training | None = None) -> None:
        self.gates = list(l0_gates(model).values())
        if not self.gates:
            raise HeadwiseError("the model has no L0 gates; call headwise.pruning.add_l0_gates(model, config) first")
        self.training = training = training or L0Training()
        self.lam, self.steps = float(training.lam), 0
        self.total = sum(g.log_alpha.numel() for g in self.gates)
        if training.target_heads is not None and training.target_heads > self.total:
            raise HeadwiseError(f"target_heads={training.target_heads} exceeds the {self.total} gated heads")

    def target(self) -> float | None:
        """The target number of open heads at the current step (None: fixed λ)."""
        final, warmup = self.training.target_heads, self.training.target_warmup
        if final is None:
            return None
        return self.total - (self.total - final) * min(1.0, self.steps / warmup if warmup else 1.0)

    def expected_open(self) -> torch.Tensor:
        return sum(g.p_open().sum() for g in self.gates)

    def __call__(self, model: nn.Module | None = None) -> torch.Tensor:
        l_c = self.expected_open()
        if self.training.reduction == "mean_over_modules":
            l_c = l_c / len(self.gates)
        return self.lam * l_c

    @torch.no_grad()
    def step(self) -> None:
        self.steps += 1
        target = self.target()
        if target is not None:
            gap = (float(self.expected_open()) - target) / self.total
            self.lam = max(0.0, self.lam + self.training.lambda_lr * gap)

    @torch.no_grad()
    def metrics(self) -> dict[str, float]:
        open_now = sum(int((g.eval_gates() > 0).sum()) for g in self.gates)
        metrics = {"l0_lambda": self.lam, "l0_expected_open": float(self.expected_open()), "l0_open_heads": open_now}
        if self.target() is not None:
            metrics["l0_target"] = self.target()
        return metrics


@torch.no_grad()
def l0_keep(model: nn.Module, keep: int | None = None, min_per_site: int = 1) -> dict[str, list[float]]:
    """0/1 masks from the L0 gates: heads whose eval gate is open, or with ``keep``, exactly ``keep`` heads: the
    ``min_per_site`` best of every gated site first (so no layer is emptied), then the largest ``log α``."""
    gates = l0_gates(model)
    if not gates:
        raise HeadwiseError("the model has no L0 gates")
    if keep is None:
        return {p: (g.eval_gates() > 0).float().tolist() for p, g in gates.items()}
    scores = {p: g.log_alpha.detach().float().cpu() for p, g in gates.items()}
    floor = sum(min(min_per_site, s.numel()) for s in scores.values())
    total = sum(s.numel() for s in scores.values())
    if not max(floor, 1) <= keep <= total:
        raise HeadwiseError(f"keep must be between {max(floor, 1)} (min_per_site={min_per_site} per gated site) "
                            f"and {total} gated heads, got {keep}")
    masks = {p: torch.zeros_like(s) for p, s in scores.items()}
    for p, s in scores.items():
        masks[p][s.topk(min(min_per_site, s.numel())).indices] = 1.0
    rest = sorted(((float(s[h]), p, h) for p, s in scores.items() for h in range(s.numel()) if not masks[p][h]),
                  reverse=True)
    for _, p, h in rest[: keep - floor]:
        masks[p][h] = 1.0
    return {p: m.tolist() for p, m in masks.items()}

