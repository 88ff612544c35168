"""The nuclear-norm term on alpha matrices (MHR Eq. 7-8), with its start point, as a ``headwise.training``
penalty that is also a ``TrainerCallback`` (pass it in both ``penalties=`` and ``callbacks=``).

For each mixer ``m`` of kind τ, with ``s = +1`` (grow) or ``−1`` (shrink) and ``n_m = ‖α_m‖_*``:

- ``form="radius"`` (the paper's reading of the growth radius Δr): ``ℓ_m = relu(Δr − s·(n_m − n_m^prev))``
  where ``n_m^prev`` is the norm before the last optimizer update. It pushes with gradient ``−s·∇n_m`` while the
  last update moved the norm by less than Δr in the wanted direction, and is silent once it did: Δr sets the
  speed. Δr = 0 turns the push off (only a move the wrong way is corrected).
- ``form="seed"`` (what MHR's code computes): ``ℓ_m = Δr + s·(sg(n_m) − n_m)``; its value is always Δr and its
  gradient always ``−s·∇n_m``: Δr has no effect on training.

Loss term: ``γ · Σ_τ r_τ Σ_{m∈τ} ℓ_m``, added to a batch-mean loss (MHR added it to a token *sum*, so its
γ corresponds to ours times the tokens per batch). Before ``start`` (a fraction of the Trainer's ``max_steps``)
the term is 0 and every mixer is frozen, as MHR freezes alphas until P% of training.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import TrainerCallback

from ..errors import HeadwiseError
from .alpha import mixers_of
from .config import NuclearNormTraining


class NuclearNormPenalty(TrainerCallback):
    """``penalty(model) -> γ Σ r_τ ℓ_m`` over the model's mixers; freezes them until ``training.start``."""

    def __init__(self, model: nn.Module, training: NuclearNormTraining | None = None) -> None:
        found = mixers_of(model)
        if not found:
            raise HeadwiseError("the model has no alpha mixers; call headwise.mixing.add_mixers(model, config) first")
        self.training = training = training or NuclearNormTraining()
        self.mixers = [m for _, m in found]
        self.kinds = [s.kind for s, _ in found]
        self.ratios = [training.ratio(k) for k in self.kinds]
        self.previous: list[float] | None = None
        self.active = False
        self.set_active(training.start <= 0.0)

    def set_active(self, active: bool) -> None:
        """Thaw (or freeze) the mixers and switch the term on (or off); the norms now are the first ``n^prev``."""
        if active and not self.active:
            self.previous = self.norms()
        self.active = active
        for m in self.mixers:
            m.frozen = not active

    @torch.no_grad()
    def norms(self) -> list[float]:
        return [float(m.nuclear_norm()) for m in self.mixers]

    def terms(self) -> list[torch.Tensor]:
        """``ℓ_m`` per mixer (see the module docstring)."""
        s, dr = self.training.sign, self.training.radius
        out = []
        for i, m in enumerate(self.mixers):
            n = m.nuclear_norm()
            if self.training.form == "seed":
                out.append(dr + s * (n.detach() - n))
            else:
                out.append(torch.relu(dr - s * (n - self.previous[i])))
        return out

    def __call__(self, model: nn.Module | None = None) -> torch.Tensor:
        if not self.active or self.training.gamma == 0:
            return torch.zeros((), device=self.mixers[0].alpha.device)
        return self.training.gamma * sum(r * t for r, t in zip(self.ratios, self.terms()))

    def step(self) -> None:
        if self.active:
            self.previous = self.norms()

    def metrics(self) -> dict[str, float]:
        norms = self.norms()
        out = {"mix_active": float(self.active)}
        for kind in dict.fromkeys(self.kinds):
            values = [n for n, k in zip(norms, self.kinds) if k == kind]
            out[f"mix_nuclear_{kind}"] = sum(values) / len(values)
        return out

    # ---- TrainerCallback: the start point as a fraction of the real number of updates ---------------------
    def on_train_begin(self, args, state, control, **kwargs):
        self.total = max(int(state.max_steps), 1)
        self.set_active(self._due(state.global_step))

    def on_step_begin(self, args, state, control, **kwargs):
        if not self.active and self._due(state.global_step):
            self.set_active(True)

    def _due(self, step: int) -> bool:
        return step / self.total >= self.training.start
