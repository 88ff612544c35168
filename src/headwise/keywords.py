"""A verb that takes both a config and keywords for its fields merges them here, once (``with_keywords``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from .errors import HeadwiseError


def with_keywords(cls: type, config: Any, **keywords: Any) -> Any:
    """The one way a verb takes both a config and keywords for its fields (``None`` = not given): a ``cls`` built
    from the keywords when ``config`` is None; else ``config`` with the keywords filling the fields it leaves unset
    (``None``, or a selection of every site). A keyword that differs from a field the config sets raises (one line
    naming each clash), never silently wins."""
    given = {k: v for k, v in keywords.items() if v is not None}
    if config is None:
        needed = [f.name for f in dataclasses.fields(cls) if f.init and f.name not in given
                  and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        if needed:
            raise HeadwiseError(f"give {', '.join(f'{k}=' for k in needed)} or a {cls.__name__}")
        return cls(**given)
    if not given:
        return config
    merged = dataclasses.replace(config, **given)  # normalised by the config's own __post_init__
    clash = [k for k in given if not _unset(getattr(config, k)) and getattr(merged, k) != getattr(config, k)]
    if clash:
        raise HeadwiseError(f"{', '.join(f'{k}={given[k]!r}' for k in clash)} conflicts with the "
                            f"{type(config).__name__} ({', '.join(f'{k}={getattr(config, k)!r}' for k in clash)}); "
                            "give one of them")
    return merged


def _unset(value: Any) -> bool:
    return value is None or getattr(value, "everything", False) is True  # a Selection() selects every site
