"""Dynamic swapping (MHR §B.3) as a ``TrainerCallback``: every round (an epoch, or ``period`` steps) a per-head
metric is measured on a few validation texts and heads are swapped, kept swapped for ``frequency`` rounds,
swapped back, left alone for ``rest`` rounds, and so on.

Rounds are 1-based as MHR's epochs. After round ``e`` the callback looks at ``c = e + 1`` (the round about to
start) with state ``(pending swaps, last)``:

1. ``c < start``: nothing; 2. ``end`` set and ``c > end``: undo a pending swap;
3. ``c − last == frequency`` with a swap pending: undo it;
4. ``c − last == frequency + rest`` or ``c == start``: measure, choose new swaps, apply them (``last = c``).

Selection among the ``L × H`` heads of one attention kind (``k = max_switches``), by the metric (higher =
more confident/important):

- ``hard``: the k highest heads paired with the k lowest (highest ↔ lowest, second ↔ second, …), any layers;
- ``soft``: for layer pairs ``(i, L−1−i)``, i < k, the ``soft_heads`` lowest heads of layer i trade places with
  the same head indices of layer ``L−1−i`` (MHR's code; ``soft_rank="both"`` pairs the lowest heads of each layer
  in rank order instead, as the paper describes);
- ``random``: a random permutation of the heads, first k paired with last k.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn
from transformers import TrainerCallback

from ..errors import HeadwiseError, renamed_fields
from ..sites import AttentionSite, select_sites
from .swap import HeadSwap, swap_heads, undo_swaps

SWAP_RULES = ("hard", "soft", "random")
Metric = Callable[[nn.Module, list[AttentionSite]], torch.Tensor]


@renamed_fields(method="rule")
@dataclass
class DynamicSwapConfig:
    """MHR's ``--dynamic-*`` options for one attention kind (one callback per kind for different settings).

    ``metric``: a ``headwise.analyze`` head metric (``confidence``, ``mhr_base``, ``mhr_advanced``, …) or
    ``avg_l2`` (paper Eq. 6: mean L2 distance of a head's attention map to the other heads'). ``period``: steps
    per round (None: one epoch per round).
    """

    kind: str = "enc-self"
    rule: str = "hard"
    metric: str = "confidence"
    start: int = 1
    frequency: int = 1
    rest: int = 1
    end: int | None = None
    max_switches: int = 1
    soft_heads: int = 4
    soft_rank: str = "first"
    period: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rule not in SWAP_RULES:
            raise HeadwiseError(f"unknown dynamic swap rule {self.rule!r}; use one of {', '.join(SWAP_RULES)}")
        if self.soft_rank not in ("first", "both"):
            raise HeadwiseError(f"soft_rank is 'first' (MHR code) or 'both' (paper), not {self.soft_rank!r}")
        if min(self.start, self.frequency, self.max_switches, self.soft_heads) < 1 or self.rest < 0:
            raise HeadwiseError("start, frequency, max_switches and soft_heads must be ≥ 1 and rest ≥ 0")
        if self.period is not None and self.period < 1:
            raise HeadwiseError(f"period is a number of steps ≥ 1, got {self.period}")


def choose_swaps(table: torch.Tensor, rule: str, k: int, soft_heads: int = 4, soft_rank: str = "first",
                 generator: torch.Generator | None = None) -> list[tuple[int, int, int, int]]:
    """Pairs ``(layer_a, head_a, layer_b, head_b)`` chosen from a metric ``table[L, H]``."""
    L, H = table.shape
    if rule == "hard" or rule == "random":
        if k > L * H - k:
            raise HeadwiseError(f"max_switches={k} needs at least {2 * k} heads, the kind has {L * H}")
        order = table.flatten().argsort(stable=True) if rule == "hard" else torch.randperm(L * H, generator=generator)
        order = order.tolist()
        pairs = zip(order[::-1][:k], order[:k]) if rule == "hard" else zip(order[:k], order[::-1][:k])
        return [(a // H, a % H, b // H, b % H) for a, b in pairs]
    if k > L - k:
        raise HeadwiseError(f"soft swapping with max_switches={k} needs at least {2 * k} layers, the kind has {L}")
    n = min(soft_heads, H)
    out = []
    for i in range(k):
        low = table[i].argsort(stable=True)[:n].tolist()
        partner = table[L - 1 - i].argsort(stable=True)[:n].tolist() if soft_rank == "both" else low
        out.extend((i, h, L - 1 - i, g) for h, g in zip(low, partner))
    return out


def analysis_metric(tokenizer: Any, texts: Sequence[str], name: str, batch_size: int = 32) -> Metric:
    """A metric function: ``headwise.analyze`` on ``texts`` → ``[L, H]`` for the given sites."""
    from ..analysis import analyze

    def measure(model: nn.Module, sites: list[AttentionSite]) -> torch.Tensor:
        stats = analyze(model, tokenizer, texts, importance=(), examples=0, batch_size=batch_size, progress=False)
        rows = {d["path"]: r for r, d in enumerate(stats.sites)}
        final = stats.finalize()
        if name == "avg_l2":
            l2 = final["similarity"]["attention_l2"]
            table = l2.sum(-1) / (l2.shape[-1] - 1)
        elif name in final["heads"]:
            table = final["heads"][name]
        else:
            raise HeadwiseError(f"unknown head metric {name!r}; use avg_l2 or one of {', '.join(final['heads'])}")
        return table[[rows[s.path] for s in sites]].float()

    return measure


class DynamicSwap(TrainerCallback):
    """``DynamicSwap(model, config, tokenizer=tok, texts=dev_texts)`` (or ``metric=fn(model, sites) -> [L, H]``).

    ``history`` records ``(round, "apply" | "undo", [HeadSwap])``.
    """

    def __init__(self, model: nn.Module, config: DynamicSwapConfig, *, tokenizer: Any = None,
                 texts: Sequence[str] | None = None, metric: Metric | None = None) -> None:
        self.model, self.config = model, config
        self.sites = select_sites(model, [config.kind])
        if any(s.shared for s in self.sites) or len({s.num_heads for s in self.sites}) != 1:
            raise HeadwiseError("dynamic swapping needs one module per layer with equal head counts")
        if metric is None:
            if tokenizer is None or not texts:
                raise HeadwiseError("dynamic swapping needs tokenizer= and texts= (validation texts) or metric=")
            if config.kind == "dec-enc":
                raise HeadwiseError("headwise.analyze measures self-attention only; pass metric= for dec-enc")
            metric = analysis_metric(tokenizer, list(texts), config.metric)
        self.metric = metric
        table = torch.zeros(len(self.sites), self.sites[0].num_heads)
        choose_swaps(table, config.rule, config.max_switches, config.soft_heads, config.soft_rank)  # sizes, now
        self.pending: list[HeadSwap] | None = None
        self.last = 0
        self.generator = torch.Generator().manual_seed(config.seed)
        self.history: list[tuple[int, str, list[HeadSwap]]] = []

    def end_of_round(self, finished: int) -> None:
        """Run the state machine after round ``finished`` (1-based)."""
        cfg, c = self.config, finished + 1
        if c < cfg.start:
            self.pending, self.last = None, 0
        elif cfg.end is not None and c > cfg.end:
            self._undo(c)
        elif c - self.last == cfg.frequency and self.pending:
            self._undo(c)
        elif c - self.last == cfg.frequency + cfg.rest or c == cfg.start:
            self._undo(c)
            table = self.metric(self.model, self.sites)
            chosen = choose_swaps(table, cfg.rule, cfg.max_switches, cfg.soft_heads, cfg.soft_rank, self.generator)
            swaps = [HeadSwap(self.sites[la].name, ha, self.sites[lb].name, hb) for la, ha, lb, hb in chosen]
            swap_heads(self.model, swaps)
            self.pending, self.last = swaps, c
            self.history.append((c, "apply", swaps))

    def _undo(self, c: int) -> None:
        if self.pending:
            undo_swaps(self.model, self.pending)
            self.history.append((c, "undo", self.pending))
        self.pending = None

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.config.period is None:
            self.end_of_round(round(state.epoch))

    def on_step_end(self, args, state, control, **kwargs):
        if self.config.period is not None and state.global_step % self.config.period == 0:
            self.end_of_round(state.global_step // self.config.period)
