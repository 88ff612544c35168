"""What verbs leave behind: the model, a JSON summary and an HTML report of an editing verb (prune, compress, ...),
and the ``--json`` document every verb prints. All JSON goes through ``io.json_text``: valid JSON, a NaN or
infinity refused with one line."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from ..report import Report


def print_json(value: Any, indent: int | None = None) -> None:
    """Print ``value`` as the verb's ``--json`` document."""
    from ..io.json_text import json_text

    print(json_text(value, "--json output", indent))


def write_json(path: str | os.PathLike, value: Any, indent: int | None = None) -> Path:
    """Write ``value`` as JSON text to ``path`` (a file inside an output being built, e.g. by ``atomic_dir``)."""
    from ..io.json_text import json_text

    path = Path(path)
    path.write_text(json_text(value, str(path.name), indent))
    return path


def save_run(path: str | os.PathLike, model: nn.Module, tokenizer: Any, summary_name: str, summary: dict,
             report: Report, overwrite: bool = False, plain: bool = False) -> Path:
    """What an editing command leaves behind, written all or nothing (one atomic swap): ``path/model``
    (``save_pretrained``), with ``plain`` also ``path/plain`` (``export_plain``), ``path/<summary_name>``
    (``summary`` as JSON) and ``path/report.html``."""
    from ..io import atomic_dir, export_plain, save_pretrained

    with atomic_dir(path, overwrite) as tmp:
        write_json(tmp / summary_name, summary, indent=1)
        save_pretrained(model, tmp / "model", tokenizer=tokenizer)
        if plain:
            export_plain(model, tmp / "plain", tokenizer)
        report.write(tmp)
    return Path(path)
