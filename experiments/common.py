"""What the experiment scripts share: the results JSON (read, merge, atomic write), the ``--device`` and ``--data``
flags, and where the results, the docs and the shared data live.

Scripts run from the repository root (``python experiments/NAME.py --help``) and import this module as ``common``.
Data comes from ``--data`` or else from ``shared/data/<path>`` found the way the library finds it
(``$HEADWISE_DATA_DIR``, or ``shared/data`` above the working directory: ``headwise.tasks.paths.shared_data``).
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any, Callable

from headwise.errors import HeadwiseError
from headwise.io import atomic_write_text
from headwise.tasks.paths import shared_data

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "experiments"
RESULTS = EXPERIMENTS / "results"
DOCS = ROOT / "docs"
WIKITEXT = "wikitext-2/valid.txt"


def load_results(path: str | Path, default: dict | None = None) -> dict:
    """The results JSON at ``path``, or a copy of ``default`` (``{}``) when there is no such file."""
    path = Path(path)
    return json.loads(path.read_text()) if path.is_file() else copy.deepcopy(default or {})


def save_results(path: str | Path, results: Any) -> None:
    """Write ``results`` to ``path`` atomically (indent 1, a final newline), creating its folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(results, indent=1) + "\n")


def merge_results(path: str | Path, update: Callable[[dict], None], default: dict | None = None) -> dict:
    """Re-read ``path`` (another job may have written it meanwhile), apply ``update`` to it, save it; returns it."""
    results = load_results(path, default)
    update(results)
    save_results(path, results)
    return results


def write_doc(name: str, text: str) -> Path:
    """Write ``docs/<name>`` (a figure or table the docs link) atomically."""
    atomic_write_text(DOCS / name, text)
    return DOCS / name


def add_device(parser: argparse.ArgumentParser, default: str = "cpu") -> None:
    parser.add_argument("--device", default=default,
                        help=f"torch device, e.g. cpu or cuda (default: {default}; training follows the model)")


def add_data(parser: argparse.ArgumentParser, relative: str, what: str) -> None:
    """``--data PATH`` (default: ``shared/data/<relative>``, see ``data_file``)."""
    text = f"{what} (default: shared/data/{relative})".replace("%", "%%")  # argparse formats help with %
    parser.add_argument("--data", type=Path, default=None, help=text)


def data_file(given: str | Path | None, relative: str, flag: str = "--data") -> Path:
    """``given`` when set (it must exist), else ``shared/data/<relative>``; an error naming ``flag`` otherwise."""
    if given is None:
        return shared_data(relative, f"{flag} PATH")
    path = Path(given).expanduser()
    if not path.exists():
        raise HeadwiseError(f"{flag} {given}: no such file or folder")
    return path
