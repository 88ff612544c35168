"""Manual swap schedules (MHR's ``config_mhr_swap.json``) as a ``TrainerCallback``.

A schedule maps a time to a list of swaps, applied in order before the first update of that time::

    {"3": [{"s_layer": "1", "s_head": 0, "s_layer_module": "encoder_attn", "s_transformer_module": "decoder",
            "d_layer": "5", "d_head": 0, "d_layer_module": "encoder_attn", "d_transformer_module": "decoder"}],
     "7": ["dec-enc.1:0 <-> dec-enc.5:0"]}

Entries are MHR dicts (0-based layer strings) or ``"site:head <-> site:head"`` strings. Times are 1-based epochs
as in MHR (``"3"``: the start of the third epoch; fractions allowed: ``"1.5"`` is half-way through the first) or,
with ``unit="step"``, 0-based optimizer steps. A file may wrap the mapping as ``{"unit": "step", "schedule": {…}}``.
There is no "swap back": list the same swaps again at a later time.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Mapping

from torch import nn
from transformers import TrainerCallback

from ..errors import HeadwiseError
from ..io.files import read_text
from .swap import HeadSwap, resolve, swap_heads

UNITS = ("epoch", "step")
_MHR_KIND = {("encoder", "self_attn"): "enc-self", ("decoder", "self_attn"): "dec-self",
             ("decoder", "encoder_attn"): "dec-enc"}


def _mhr_end(entry: dict, prefix: str) -> tuple[str, int]:
    module = (entry[f"{prefix}_transformer_module"], entry[f"{prefix}_layer_module"])
    if module not in _MHR_KIND:
        raise HeadwiseError(f"unknown MHR attention {module}; use encoder/self_attn, decoder/self_attn or "
                            "decoder/encoder_attn")
    return f"{_MHR_KIND[module]}.{int(entry[f'{prefix}_layer'])}", int(entry[f"{prefix}_head"])


def parse_swap(entry: Any) -> HeadSwap:
    """One schedule entry (an MHR dict or a ``"site:head <-> site:head"`` string) as a ``HeadSwap``."""
    if isinstance(entry, str):
        return HeadSwap.parse(entry)
    if isinstance(entry, dict):
        try:
            (a, ah), (b, bh) = _mhr_end(entry, "s"), _mhr_end(entry, "d")
        except KeyError as err:
            raise HeadwiseError(f"MHR swap entry lacks {err.args[0]!r}") from None
        except HeadwiseError:
            raise
        except ValueError as err:
            raise HeadwiseError(f"MHR swap entry has a non-integer layer or head ({err})") from None
        return HeadSwap(a, ah, b, bh)
    raise HeadwiseError(f"a swap is an MHR dict or a 'site:head <-> site:head' string, not {entry!r}")


def _line_of(text: str, key: str) -> int | None:
    match = re.search(rf'"{re.escape(key)}"\s*:', text)
    return None if match is None else text.count("\n", 0, match.start()) + 1


def read_schedule(path: str | Path) -> tuple[dict[str, list], str | None, str]:
    """Read a schedule file: ``(mapping, unit or None, file text)``. Parse errors name the line."""
    path = Path(path)
    if not path.is_file():
        raise HeadwiseError(f"swap schedule not found: {path}")
    text = read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise HeadwiseError(f"{path}, line {err.lineno} column {err.colno}: not valid JSON ({err.msg})") from None
    if not isinstance(data, dict):
        raise HeadwiseError(f"{path}: a swap schedule is a JSON object {{time: [swaps]}}")
    unit = data.get("unit") if "schedule" in data else None
    mapping = data["schedule"] if "schedule" in data else data
    return mapping, unit, text


class SwapSchedule(TrainerCallback):
    """``SwapSchedule(model, schedule_or_path, unit="epoch")``: apply scheduled swaps during ``Trainer.train``.

    The whole schedule is checked against ``model`` here, so a bad swap fails before training starts.
    ``applied`` lists ``(step, swap)`` in the order they happened.
    """

    def __init__(self, model: nn.Module, schedule: Mapping[str | float, list] | str | Path, unit: str = "epoch",
                 include_output: bool = False) -> None:
        text, where = None, "schedule"
        if isinstance(schedule, (str, Path)):
            where = str(schedule)
            schedule, file_unit, text = read_schedule(schedule)
            unit = file_unit or unit
        if unit not in UNITS:
            raise HeadwiseError(f"{where}: unknown unit {unit!r}; use one of {', '.join(UNITS)}")
        self.model, self.unit, self.include_output = model, unit, include_output
        self.times: list[tuple[float, list[HeadSwap]]] = []
        for key, entries in schedule.items():
            line = _line_of(text, str(key)) if text else None
            at = f"{where}{'' if line is None else f', line {line}'} (time {key!r})"
            try:
                time = float(key)
            except (TypeError, ValueError):
                raise HeadwiseError(f"{at}: times are numbers (epochs or steps)") from None
            if not math.isfinite(time) or time < (1 if unit == "epoch" else 0):
                raise HeadwiseError(f"{at}: {'epochs start at 1' if unit == 'epoch' else 'steps start at 0'}")
            if not isinstance(entries, list):
                raise HeadwiseError(f"{at}: expected a list of swaps")
            try:
                swaps = [parse_swap(e) for e in entries]
                resolve(model, swaps)
            except HeadwiseError as err:
                raise HeadwiseError(f"{at}: {err}") from None
            self.times.append((time, swaps))
        self.times.sort(key=lambda t: t[0])
        self.steps: list[tuple[int, list[HeadSwap]]] = []
        self.applied: list[tuple[int, HeadSwap]] = []

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        per_epoch = 1
        if self.unit == "epoch":
            if train_dataloader is None:
                raise HeadwiseError("an epoch schedule needs the Trainer's train_dataloader to count steps per epoch")
            per_epoch = max(1, math.ceil(len(train_dataloader) / args.gradient_accumulation_steps))
        self.steps = [(round((t - 1) * per_epoch) if self.unit == "epoch" else int(t), s) for t, s in self.times]

    def on_step_begin(self, args, state, control, **kwargs):
        while self.steps and self.steps[0][0] <= state.global_step:
            _, swaps = self.steps.pop(0)
            swap_heads(self.model, swaps, self.include_output)
            self.applied.extend((state.global_step, s) for s in swaps)
