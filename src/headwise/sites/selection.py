"""``Selection``: which attention sites a method edits, one value for every verb (``select_sites`` applies it), and
the attention kinds. Light (no torch): method configs, which the command line reads to build its options, use it."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Literal, get_args

from ..errors import HeadwiseError
from ..keywords import with_keywords

if TYPE_CHECKING:
    from torch import nn

    from .base import AttentionSite

Kind = Literal["enc-self", "dec-self", "dec-enc"]
KINDS: tuple[str, ...] = get_args(Kind)  # every attention kind, in this order


def _as_tuple(value: Any, what: str, kind: type) -> tuple | None:
    if value is None:
        return None
    items = (value,) if isinstance(value, (str, int)) else tuple(value)
    bad = [v for v in items if not isinstance(v, kind) or isinstance(v, bool)]
    if bad:
        raise HeadwiseError(f"selection {what} must be {kind.__name__}s, got {bad[0]!r}")
    return items


@dataclass(frozen=True)
class Selection:
    """Which attention sites a method edits (``select_sites``): ``kinds`` (``"enc-self"``, ``"dec-self"``,
    ``"dec-enc"``), ``layers`` (indices) and ``names`` (site names such as ``enc-self.3`` or module paths);
    ``None`` does not filter. Unknown kinds, layers or names raise when the selection meets a model."""

    kinds: tuple[str, ...] | None = None
    layers: tuple[int, ...] | None = None
    names: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kinds", _as_tuple(self.kinds, "kinds", str))
        object.__setattr__(self, "layers", _as_tuple(self.layers, "layers", int))
        object.__setattr__(self, "names", _as_tuple(self.names, "names", str))

    @property
    def everything(self) -> bool:
        return self.kinds is None and self.layers is None and self.names is None

    def sites(self, model: nn.Module) -> list[AttentionSite]:
        from .registry import select_sites

        return select_sites(model, self.kinds, layers=self.layers, names=self.names)


def selection_of(verb: str, selection: Selection | None, *, sites: "Iterable[AttentionSite | str] | None" = None,
                 **former: Any) -> Selection:
    """The ``selection`` of a verb that took ``sites=`` (site objects, names or paths) or ``kinds=`` / ``layers=``
    before it took a ``Selection``: each former keyword given (not ``None``) warns (``FutureWarning``, for one
    release) and joins the selection (``sites`` as ``names``); one that conflicts with ``selection`` raises."""
    given = {k: v for k, v in {"sites": sites, **former}.items() if v is not None}
    if given:
        warnings.warn(f"{verb}({', '.join(f'{k}=' for k in given)}) is deprecated; pass selection=Selection(...)",
                      FutureWarning, stacklevel=3)
    if sites is not None:
        from .base import AttentionSite

        given["names"] = [s.path if isinstance(s, AttentionSite) else s for s in given.pop("sites")]
    return with_keywords(Selection, selection or Selection(), **given)
