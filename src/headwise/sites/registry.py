"""Which adapter reads which model family, and ``find_sites``."""

from __future__ import annotations

from typing import Iterable, Sequence

from torch import nn

from ..errors import HeadwiseError
from .base import Adapter, AttentionSite, FamilyLayout

_ADAPTERS: dict[str, Adapter] = {}
_LAYOUTS: dict[str, FamilyLayout] = {}
_KIND_ORDER = {"enc-self": 0, "dec-self": 1, "dec-enc": 2}


def register_adapter(model_types: list[str] | str, adapter: Adapter, layout: FamilyLayout | None = None) -> None:
    """Teach headwise a new family: ``adapter(model) -> [AttentionSite]`` for these ``config.model_type`` values,
    and its ``layout`` (what surgery and collaborative conversion need; default: the common attribute names)."""
    for model_type in [model_types] if isinstance(model_types, str) else model_types:
        _ADAPTERS[model_type] = adapter
        _LAYOUTS[model_type] = layout or FamilyLayout()


def family_layout(family: str) -> FamilyLayout:
    """The registered layout of ``family`` (a ``config.model_type``)."""
    return _LAYOUTS.get(family) or FamilyLayout()


def supported_families() -> list[str]:
    return sorted(_ADAPTERS)


def families_with(capability: str) -> list[str]:
    """The registered families whose layout has ``capability`` (a boolean ``FamilyLayout`` field)."""
    return sorted(f for f, layout in _LAYOUTS.items() if getattr(layout, capability))


def find_sites(model: nn.Module) -> list[AttentionSite]:
    """Every attention site of ``model``, ordered by kind then layer.

    Raises ``HeadwiseError`` for a family without an adapter, naming the class and the supported families.
    """
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    adapter = _ADAPTERS.get(model_type)
    if adapter is None:
        raise HeadwiseError(
            f"{type(model).__name__} (model_type={model_type!r}) is not a supported family. "
            f"Supported: {', '.join(supported_families())}. To add one, write an adapter that returns "
            "AttentionSite objects for its attention modules and call "
            "headwise.sites.register_adapter(['<model_type>'], adapter) (see src/headwise/sites/families.py)."
        )
    sites = adapter(model)
    if not sites:
        raise HeadwiseError(
            f"The {model_type} adapter found no attention modules in {type(model).__name__}: this transformers "
            "version may have renamed them; please report it with your transformers version."
        )
    return sorted(sites, key=lambda s: (_KIND_ORDER[s.kind], s.layer))


def site_table(sites: Iterable[AttentionSite]) -> dict[str, AttentionSite]:
    """``{module path: site} | {name: site}`` (names such as ``enc-self.3``): the one lookup of a site by either."""
    sites = list(sites)
    return {s.path: s for s in sites} | {s.name: s for s in sites}


def site_by_path(model: nn.Module, path: str) -> AttentionSite:
    """The site whose module is at ``path``, or whose name is ``path`` (raises with the valid names otherwise)."""
    sites = find_sites(model)
    site = site_table(sites).get(path)
    if site is None:
        raise HeadwiseError(f"No attention site {path!r}. Sites: {', '.join(s.name for s in sites)}")
    return site


def recorded_sites(model: nn.Module, paths: Iterable[str], what: str) -> dict[str, AttentionSite]:
    """``{path: site}`` of the model, once every path a record names (an edit, a saved op) is one of them; a
    missing path raises naming ``what`` and the sites there are."""
    sites = {s.path: s for s in find_sites(model)}
    missing = next((p for p in paths if p not in sites), None)
    if missing is not None:
        raise HeadwiseError(f"{what} names site {missing!r}, absent from the model (sites: {', '.join(sites)}); "
                            "load it into the architecture it was saved from")
    return sites


def select_sites(model: nn.Module, kinds: Sequence[str] | None = None, *, layers: Sequence[int] | None = None,
                 names: Sequence["str | AttentionSite"] | None = None) -> list[AttentionSite]:
    """The one way every method picks sites: those of ``kinds`` (``"enc-self"``...), serving one of ``layers``, and
    named in ``names`` (site names, module paths or ``AttentionSite`` objects); ``None`` does not filter.

    Unknown kinds, layers or names raise ``HeadwiseError`` listing what the model has; an empty result raises too.
    """
    sites = find_sites(model)
    if kinds is not None:
        have = sorted({s.kind for s in sites})
        missing = [k for k in kinds if k not in have]
        if missing:
            raise HeadwiseError(f"{type(model).__name__} has no {missing[0]!r} attention; its kinds: {', '.join(have)}")
        sites = [s for s in sites if s.kind in kinds]
    if layers is not None:
        have_layers = sorted({layer for s in sites for layer in s.layers})
        missing = [layer for layer in layers if layer not in have_layers]
        if missing:
            raise HeadwiseError(f"no attention site serves layer {missing[0]}; layers: {have_layers}")
        sites = [s for s in sites if set(s.layers) & set(layers)]
    if names is not None:
        keys = [n.path if isinstance(n, AttentionSite) else str(n) for n in names]
        table = site_table(sites)
        missing = [k for k in keys if k not in table]
        if missing:
            raise HeadwiseError(f"no attention site {missing[0]!r} among the selected ones: "
                                f"{', '.join(s.name for s in sites)}")
        chosen = {table[k].path for k in keys}
        sites = [s for s in sites if s.path in chosen]
    if not sites:
        raise HeadwiseError(f"the selection (kinds={kinds}, layers={layers}, names={names}) holds no attention site")
    return sites


