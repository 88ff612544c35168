"""headwise: find, measure and edit the attention heads of transformers models.

The verbs and their configs, one per method (each also has a ``headwise <verb>`` command); the packages
(``headwise.pruning``, ``headwise.mixing``, ...) hold the rest. ``headwise.apply(model, config)`` /
``headwise.remove(model, method)`` run any registered method (``headwise.contract``).

The names load on first use: ``import headwise`` alone (and the command line's parser, ``headwise --help``) imports
neither torch nor transformers; the first public name used imports every package below, so that every method is
registered before any checkpoint is read.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from .errors import HeadwiseError
from .version import __version__, check_transformers

check_transformers()  # a transformers outside the tested range is refused in one line (read from its metadata)

# public name → the module that defines it (``headwise.X`` is ``<module>.X``; "replace_attention" and
# "restore_attention" are headwise.mechanisms' use and remove)
_SOURCES: dict[str, str] = {
    **dict.fromkeys(("AnalysisConfig", "HeadStats", "analyze"), "analysis"),
    **dict.fromkeys(("CollaborativeConfig", "compress"), "collaborative"),
    **dict.fromkeys(("Selection", "apply", "remove"), "contract"),
    **dict.fromkeys(("convert_gqa", "convert_latent"), "conversion"),
    **dict.fromkeys(("evaluate_stsb", "fidelity", "get_task"), "tasks"),
    **dict.fromkeys(("from_pretrained", "save_pretrained"), "io"),
    **dict.fromkeys(("KVGateConfig", "KVPolicy", "apply_kv_policy", "kv_policy", "remove_kv_policy"), "kvcache"),
    **dict.fromkeys(("replace_attention", "restore_attention"), "mechanisms"),
    **dict.fromkeys(("MixingConfig", "add_mixers", "fold_mixing", "remove_mixers", "swap_heads"), "mixing"),
    "load_model": "models",
    **dict.fromkeys(("Budget", "Plan", "plan"), "planning"),
    **dict.fromkeys(("L0Config", "add_l0_gates", "apply_masks", "prune_heads", "prune_masked", "remove_l0_gates",
                     "remove_masks"), "pruning"),
    **dict.fromkeys(("QuantizationConfig", "quantize_attention", "remove_quantization"), "quantization"),
    **dict.fromkeys(("add_gates", "enable", "remove_gates"), "runtime"),
    **dict.fromkeys(("AttentionSite", "find_sites", "select_sites"), "sites"),
    **dict.fromkeys(("recover", "train_kv_gates"), "training"),
}
_RENAMED = {"replace_attention": "use", "restore_attention": "remove"}


def _load_all() -> None:
    """Import every package that defines a public name (the method registries fill as they import) and bind the
    names on this module, so that ``__getattr__`` runs once."""
    for name, module in _SOURCES.items():
        globals()[name] = getattr(importlib.import_module(f".{module}", __name__), _RENAMED.get(name, name))


def __getattr__(name: str) -> Any:
    if name not in _SOURCES:
        if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
            _load_all()  # a package (``headwise.io``), with every method registered as for a name
            return importlib.import_module(f".{name}", __name__)
        raise AttributeError(f"module 'headwise' has no attribute {name!r}")
    _load_all()
    return globals()[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_SOURCES))


__all__ = ["__version__", "HeadwiseError", *_SOURCES]  # the public names: each package's, in _SOURCES
