"""What an editing verb (prune, compress, ...) leaves behind: the model, a JSON summary and an HTML report."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from torch import nn

from ..io import atomic_dir, export_plain, save_pretrained
from ..report import Report


def save_run(path: str | os.PathLike, model: nn.Module, tokenizer: Any, summary_name: str, summary: dict,
             report: Report, overwrite: bool = False, plain: bool = False) -> Path:
    """What an editing command leaves behind, written all or nothing (one atomic swap): ``path/model``
    (``save_pretrained``), with ``plain`` also ``path/plain`` (``export_plain``), ``path/<summary_name>``
    (``summary`` as JSON) and ``path/report.html``."""
    with atomic_dir(path, overwrite) as tmp:
        save_pretrained(model, tmp / "model", tokenizer=tokenizer)
        if plain:
            export_plain(model, tmp / "plain", tokenizer)
        (tmp / summary_name).write_text(json.dumps(summary, indent=1))
        report.write(tmp)
    return Path(path)
