"""What attention replacement does under the method contract (declared in ``declaration.py``), one name
throughout: the method ``replace`` (formerly ``mechanism``, still read), ``ReplaceConfig``,
``headwise.replace_attention`` / ``restore_attention`` and the ``headwise replace`` verb.
``headwise.apply(model, ReplaceConfig("performer", {"features": 64}))`` runs a mechanism at the selected sites with
the pretrained q/k/v/o weights. ``headwise.plan`` tries a sliding local window on the layers it disturbs least; the
cost model counts softmax and local windows, and says it cannot count the other mechanisms."""

from __future__ import annotations

import math
from typing import Any

from torch import nn

from ..contract import MethodHooks, Selection, register
from ..declaration import AttentionCost, Levels, PlanContext
from ..errors import HeadwiseError
from ..progress import progress_bar
from ..runtime.ops import ATTR
from ..sites import AttentionSite, find_sites
from .config import ReplaceConfig
from .declaration import REPLACE
from .dropin import SLOT_NAME, mechanisms_of, remove, use

MIN_WINDOW = 16  # a local window is tried when sequences hold at least 4 windows of this size


def window_levels(model: nn.Module, context: PlanContext) -> Levels:
    """A sliding local window (a quarter of the sequence, a power of two) on the half of the self-attention
    layers whose outputs it changes least (the output error of the window on each layer alone), then on all."""
    window = 2 ** int(math.log2(max(context.sequence_length / 4, 1)))
    if window < MIN_WINDOW:
        return Levels(why_none=f"sequences average {context.sequence_length:.0f} tokens: a local window of "
                               f"≥ {MIN_WINDOW} would see them whole")
    sites = [s for s in find_sites(model) if s.kind != "dec-enc" and s.positions != "relative"]
    if not sites:
        return Levels(why_none="no self-attention site with absolute or rotary positions")

    def local(names: list[str]) -> ReplaceConfig:
        return ReplaceConfig("local", {"window": window}, selection=Selection(names=tuple(sorted(names))))

    errors = {}
    for site in progress_bar(sites, desc="local-window error per layer", unit="layer",
                             disable=None if context.progress is None else not context.progress):
        try:
            errors[site.name] = context.error([local([site.name])])
        except HeadwiseError as err:
            return Levels(why_none=str(err))
    ranked = sorted(errors, key=errors.get)
    levels = [(f"local{window}-{n}L", local(ranked[:n])) for n in sorted({max(1, len(ranked) // 2), len(ranked)})]
    return Levels(levels, site_proxy=errors, proxy_label="local-window error")


def describe(config: ReplaceConfig) -> str:
    args = ",".join(f"{k}={v}" for k, v in config.args.items())
    names = config.selection.names
    return f"{config.mechanism}({args}) on {'every layer' if names is None else f'{len(names)} layers'}"


def _at_site(config: ReplaceConfig, site: str) -> str | None:
    names = config.selection.names
    return config.mechanism if names is None or site in names else None


def site_cost(site: AttentionSite, length: float) -> AttentionCost | None:
    """What the mechanism at ``site`` changes in its attention cost: nothing for softmax, the keys a query sees
    for a local window, and for any other mechanism that the cost model does not count it."""
    ops = getattr(site.module, ATTR, None)
    op = ops.mechanism[SLOT_NAME] if ops is not None and SLOT_NAME in ops.mechanism else None
    if op is None:
        return None
    core = op.core
    window = getattr(core.config, "window", None)
    if core.name == "softmax":
        return AttentionCost()
    if core.name == "local" and window:
        return AttentionCost(key_span=window if site.causal else 2 * window - 1)
    return AttentionCost(uncounted=f"{core.name} attention at {site.name} ({core.complexity}): the cost model "
                                   "counts softmax and local windows only")


@register(REPLACE)
class Replace(MethodHooks):
    identity = True
    levels = staticmethod(window_levels)
    describe = staticmethod(describe)
    at_site = staticmethod(_at_site)
    cost = staticmethod(site_cost)

    def attach(self, model: nn.Module, config: ReplaceConfig) -> Any:
        return use(model, config.mechanism, selection=config.selection, **config.args)

    def example(self, model: nn.Module) -> ReplaceConfig:
        return ReplaceConfig("softmax")

    def detach(self, model: nn.Module) -> None:
        remove(model)

    def present(self, model: nn.Module) -> bool:
        return bool(mechanisms_of(model))
