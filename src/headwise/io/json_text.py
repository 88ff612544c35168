"""The one place headwise turns results into JSON text (``--json`` output, summaries, plans, records): always valid
JSON, so a non-finite number (NaN, ±inf, which ``json`` would write as bare ``NaN``/``Infinity`` tokens) is refused
with where it sits, and nothing is written."""

from __future__ import annotations

import json
import math
from typing import Any

from ..errors import HeadwiseError


def non_finite(value: Any, where: str = "") -> tuple[str, float] | None:
    """``(path, number)`` of the first NaN or ±inf float inside ``value`` (dicts and lists walked; path like
    ``points[2].measured.score``), None when there is none."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (where or "the value", value)
    if isinstance(value, dict):
        items = ((f"{where}.{k}" if where else str(k), v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    return next((found for path, v in items if (found := non_finite(v, path)) is not None), None)


def json_text(value: Any, what: str, indent: int | None = None) -> str:
    """``value`` as JSON text (``json.dumps`` with ``allow_nan=False``); a NaN or infinity inside is refused with
    one line naming ``what`` (the output) and the number's path."""
    found = non_finite(value)
    if found is not None:
        raise HeadwiseError(f"{what}: {found[0]} is {found[1]}, not a finite number, so nothing was written; the "
                            "model or the data produced it (check for NaN/inf weights, gates or inputs)")
    return json.dumps(value, indent=indent, allow_nan=False)
