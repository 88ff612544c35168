"""Attention replacement under the method contract, one name throughout: the method ``replace`` (formerly
``mechanism``, still read), ``ReplaceConfig``, ``headwise.replace_attention`` / ``restore_attention`` and the
``headwise replace`` verb. ``headwise.apply(model, ReplaceConfig("performer", {"features": 64}))`` runs a mechanism
at the selected sites with the pretrained q/k/v/o weights. ``headwise.plan`` tries a sliding local window on the
layers it disturbs least."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ..contract import MethodConfig, Selection, register_method
from ..errors import HeadwiseError
from ..progress import progress_bar
from ..sites import find_sites
from ..sweep import Levels, Sweep, SweepContext
from .base import get_mechanism
from .dropin import apply, mechanisms_of, remove

MIN_WINDOW = 16  # a local window is tried when sequences hold at least 4 windows of this size


@dataclass
class ReplaceConfig(MethodConfig):
    """An efficient attention ``mechanism`` (a name of ``list_mechanisms()``) with its ``args``."""

    mechanism: str = field(default="softmax", metadata={
        "help": "an efficient attention mechanism: a name of headwise mechanisms list"})
    args: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "the mechanism's arguments, e.g. {\"window\": 16} (headwise mechanisms list shows each one's)"})

    def __post_init__(self) -> None:
        get_mechanism(self.mechanism)  # an unknown name raises, listing the known ones


def window_levels(model: nn.Module, context: SweepContext) -> Levels:
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


register_method("replace", ReplaceConfig,
                lambda model, c: apply(model, c.mechanism, selection=c.selection, **c.args),
                remove=remove, present=lambda model: bool(mechanisms_of(model)),
                example=lambda model: ReplaceConfig("softmax"), identity=True,
                sweep=Sweep(window_levels, describe, order=40, role="pair", at_site=_at_site,
                            label="efficient mechanism"),
                aliases=("mechanism",))
