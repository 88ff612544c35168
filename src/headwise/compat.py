"""The transformers API differences headwise bridges, in one place.

Keywords that only some models' forwards take (a causal LM's ``logits_to_keep``, a decoder's ``use_cache``) are
passed through ``taken_keywords``.

From transformers 5.24 the per-call KV cache is the keyword ``cache`` of every forward and of ``generate``'s
``model_kwargs`` (``past_key_values`` stays a deprecated alias until 5.40); before, it is ``past_key_values``.
``CACHE`` names the keyword of the installed version; ``pop_cache`` reads a cache passed under either name.
"""

from __future__ import annotations

import inspect
from typing import Any

from transformers.models.llama.modeling_llama import LlamaModel

CACHE_NAMES = ("cache", "past_key_values")
CACHE = "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"


def pop_cache(kwargs: dict[str, Any]) -> Any:
    """Remove the cache from a forward's ``kwargs`` (under either name) and return it (None without one)."""
    found = [kwargs.pop(name) for name in CACHE_NAMES if name in kwargs]
    return next((c for c in found if c is not None), None)


def cache_given(kwargs: dict[str, Any]) -> bool:
    """Whether ``kwargs`` (a forward's, or ``generate``'s ``model_kwargs``) holds a cache under either name."""
    return any(kwargs.get(name) is not None for name in CACHE_NAMES)


def taken_keywords(model: Any, **keywords: Any) -> dict[str, Any]:
    """The ``keywords`` that ``model.forward`` takes, e.g. ``logits_to_keep=1`` for a causal LM and nothing for an
    encoder."""
    params = inspect.signature(model.forward).parameters
    return {name: value for name, value in keywords.items() if name in params}


def no_cache(model: Any) -> dict[str, bool]:
    """``{"use_cache": False}`` for a model that would otherwise fill a key/value cache nobody reads (a loss, a
    calibration pass: every layer's keys and values, 0.18x the weights of SmolLM2-135M at 2,048 tokens), else ``{}``.
    Not on ``meta``: without a cache, transformers reads the position ids to detect packed sequences, which meta
    tensors refuse."""
    if next(model.parameters()).device.type == "meta" or not getattr(getattr(model, "config", None), "use_cache",
                                                                        None):
        return {}
    return taken_keywords(model, use_cache=False)
