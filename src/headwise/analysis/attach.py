"""Attaching per-site helpers (observers, gates) for the duration of a ``with`` block.

Helpers attached here count their calls: a module serving several layers (ALBERT) is called once per layer
in every forward, so call ``k`` of a forward belongs to the site's ``k``-th layer. A forward pre-hook on the
model resets the counts at the start of every forward, so a forward that failed half-way cannot shift them.
"""

from __future__ import annotations

import uuid
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
from torch import nn

from ..compat import no_cache, taken_keywords
from ..runtime import add_observer, attach, detach
from ..runtime.gates import LayerCounted
from ..sites import AttentionSite
from .rows import Row, rows_by_site


@contextmanager
def per_site(model: nn.Module, rows: list[Row], build: Callable[[AttentionSite, int, int], LayerCounted],
             slot: str = "observer", prefix: str = "analysis") -> Iterator[dict[str, LayerCounted]]:
    """Attach ``build(site, first_row, n_layers)`` to every site of ``rows`` as an observer or output op.

    Yields ``{site.path: helper}``; everything is detached on exit, also on error.
    """
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"  # unique: other ops, or another analysis, may be attached
    helpers: dict[str, LayerCounted] = {}
    sites: list[AttentionSite] = []

    def reset(_module: nn.Module, _args: tuple) -> None:
        for helper in helpers.values():
            helper.calls = 0

    hook = model.register_forward_pre_hook(reset)
    try:
        for site, first, n_layers in rows_by_site(rows):
            helper = build(site, first, n_layers)
            sites.append(site)
            if slot == "observer":
                add_observer(site, name, helper)
            else:
                attach(site, slot, name, helper)
            helpers[site.path] = helper
        yield helpers
    finally:
        hook.remove()
        for site in sites:
            detach(site, name)


def observed_call(model: nn.Module, inputs: dict[str, torch.Tensor]) -> Any:
    """``model(**inputs)`` for the attention calls its observers read: no key/value cache, and a language model's
    head on the last position only (``logits_to_keep=1``), where its forward takes those keywords (``compat``) —
    the outputs are not read, and at long context the cache and a ``[B, T, vocab]`` logits tensor would be the
    largest tensors of the pass."""
    return model(**inputs, **no_cache(model), **taken_keywords(model, logits_to_keep=1))
