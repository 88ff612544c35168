"""Randomness as the papers use it: a ``redraw`` policy, a seed, and generators on the input's device.

``fixed``: one draw from ``seed``, used in training and evaluation. ``every_step``: a fresh draw at every training
forward. ``every_n_steps``: a fresh draw every ``redraw_steps`` training forwards. Evaluation never redraws, so it
is deterministic: it uses the latest draw (the seed's first draw until training redraws).
Draw ``i`` comes from a generator seeded with ``seed * 1_000_003 + i`` on the device of the tensors it fills, so
runs are reproducible and nothing is created on the CPU inside a forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..errors import HeadwiseError
from .base import MechanismConfig, positive

POLICIES = ("fixed", "every_step", "every_n_steps")


@dataclass
class RandomConfig(MechanismConfig):
    """Arguments shared by the random mechanisms (Performer, RFA, Scatterbrain, RA, LARA, EVA-paper)."""

    redraw: str = field(default="fixed", metadata={"help": "when training draws fresh randomness: fixed, every_step "
                                                           "or every_n_steps (evaluation never redraws)",
                                                   "choices": POLICIES})
    redraw_steps: int = field(default=1000, metadata={"help": "training forwards between draws (every_n_steps)"})
    seed: int = field(default=0, metadata={"help": "seed of the random draws"})

    def check(self) -> None:
        if self.redraw not in POLICIES:
            raise HeadwiseError(f"redraw must be one of {', '.join(POLICIES)}, got {self.redraw!r}")
        positive("redraw_steps", self.redraw_steps)


def generator(device: torch.device, seed: int) -> torch.Generator:
    """A generator seeded with ``seed`` that fills tensors on ``device`` (a CPU one for the shapeless ``meta``)."""
    device = torch.device(device)
    gen = torch.Generator() if device.type in ("cpu", "meta") else torch.Generator(device=device)
    return gen.manual_seed(seed)


class Draws(torch.nn.Module):
    """Counts training forwards and says which draw is current; the draw index is a buffer (saved and reloaded)."""

    def __init__(self, config: RandomConfig) -> None:
        super().__init__()
        self.policy, self.every, self.seed = config.redraw, config.redraw_steps, config.seed
        self.calls = 0
        self.register_buffer("index", torch.zeros((), dtype=torch.long), persistent=True)
        self.current = 0  # python mirror of ``index`` (no device sync per forward)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # keep the mirror in step with a reload
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        if prefix + "index" in state_dict and state_dict[prefix + "index"].device.type != "meta":
            self.current = int(state_dict[prefix + "index"])

    def step(self, training: bool) -> bool:
        """Advance by one forward; True when this (training) forward starts a new draw."""
        if not training or self.policy == "fixed":
            return False
        self.calls += 1
        if self.calls % (self.every if self.policy == "every_n_steps" else 1):
            return False
        self.current += 1
        self.index.fill_(self.current)
        return True

    def generator(self, device: torch.device) -> torch.Generator:
        return generator(device, self.seed * 1_000_003 + self.current)
