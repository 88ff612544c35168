"""Packages whose names load on first use, so that their light modules import without torch.

A package's ``__init__`` lists its public names as plain imports under ``if TYPE_CHECKING:`` (what readers, type
checkers and ``tests/test_import_layers.py`` see) and ends with ``__getattr__, __dir__ = _lazy(__name__,
globals())`` (``from ..lazy import attach as _lazy``, so that a package's own ``attach`` stays its own). The first
public name used imports every module of that block, in order, and binds every name, so a package registers what
it registers (methods, op types, family adapters) exactly as an eager ``__init__`` would; importing one of its
modules by name (``import headwise.pruning.declaration``) runs only that module.

>>> from headwise.pruning import L0Config          # the whole package loads, as before
>>> import headwise.pruning.declaration            # that module alone: no torch
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import Any, Callable

LOADERS = "__headwise_load__"  # the attribute of a lazy package that loads all of it


def _stub(path: str, package: str) -> list[tuple[str, str, str | None]]:
    """``(public name, module, attribute or None for a submodule)`` of the imports under ``if TYPE_CHECKING:`` in
    the package's ``__init__`` at ``path``, in order."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    block = next((node for node in tree.body if isinstance(node, ast.If) and isinstance(node.test, ast.Name)
                  and node.test.id == "TYPE_CHECKING"), None)
    if block is None:
        raise ImportError(f"{package}: a lazy package lists its names under `if TYPE_CHECKING:` in {path}")
    out = []
    for node in block.body:
        if not isinstance(node, ast.ImportFrom):
            raise ImportError(f"{package}: only `from ... import ...` lines belong in its TYPE_CHECKING block")
        base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
        module = ".".join(base + ([node.module] if node.module else []))
        for alias in node.names:
            name = alias.asname or alias.name
            out.append((name, f"{module}.{alias.name}", None) if node.module is None else (name, module, alias.name))
    return out


def attach(package: str, namespace: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for the lazy package ``package`` whose module globals are ``namespace``; also
    sets ``namespace[LOADERS]``, the function that loads every name (``load``), and ``__all__``: every name of the
    block without a leading underscore (the list is written once)."""
    table = _stub(namespace["__file__"], package)
    names = {name: (module, attr) for name, module, attr in table}
    namespace["__all__"] = [name for name in names if not name.startswith("_")]
    state = {"loading": False, "loaded": False}

    def one(name: str) -> Any:
        module, attr = names[name]
        value = importlib.import_module(module) if attr is None else getattr(importlib.import_module(module), attr)
        namespace[name] = value
        return value

    def load_all() -> None:
        if state["loaded"] or state["loading"]:
            return
        state["loading"] = True
        try:
            for name in names:
                one(name)
            state["loaded"] = True
        finally:
            state["loading"] = False

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if state["loading"]:  # a module of the package uses a sibling's name while the package loads
            return one(name)
        load_all()
        return namespace[name]

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    namespace[LOADERS] = load_all
    return __getattr__, __dir__


def load(package: str) -> None:
    """Import ``package`` whole: a lazy package's every name (an eager package is whole once imported)."""
    loader = getattr(importlib.import_module(package), LOADERS, None)
    if loader is not None:
        loader()
