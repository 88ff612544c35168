"""Fixed 0/1 head masks: from Python, from Voita's per-kind ``alive_heads`` tables, or from a JSON/YAML file.

A mask is a ``HeadMask`` op in the output slot (``out[:, :, h] *= mask[h]``), so it runs on every attention
path and is saved with the model. ``headwise.pruning.prune_masked`` later turns masks into physical removal.

Accepted forms (``MaskSpec``), keys may be mixed:

- a site: ``{"enc-self.3": [1, 0, 1, ...]}`` (name, module path or ``AttentionSite``), one 0/1 per head;
- a kind: ``{"enc-self": [[1, 0, ...], [1, 1, ...], ...]}``, one row per layer of that kind (Voita's
  ``alive_heads``; a module shared by several layers, as in ALBERT, must get identical rows).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from ..errors import HeadwiseError
from ..io.files import read_text
from ..runtime.attention import enable
from ..runtime.gates import HeadMask
from ..runtime.ops import attach, detach_all, ops_of
from ..sites import AttentionSite, find_sites, site_table

MaskSpec = Mapping[Any, Sequence]


def _as_row(site: AttentionSite, values: Sequence, where: str) -> list[float]:
    if not isinstance(values, (list, tuple, torch.Tensor)):
        raise HeadwiseError(f"mask for {where} must be a list of 0/1 per head, got {values!r}")
    row = list(values)
    if len(row) != site.num_heads:
        raise HeadwiseError(f"mask for {where} has {len(row)} entries; {site.name} has {site.num_heads} heads")
    if any(v not in (0, 1, True, False) for v in row):
        raise HeadwiseError(f"mask for {where} must hold only 0/1 values, got {row}")
    return [float(v) for v in row]


def resolve_masks(model: nn.Module, spec: MaskSpec) -> dict[str, list[float]]:
    """``{site path: [0/1] * H}`` for a ``MaskSpec``; validates shapes, values and names, changes nothing."""
    sites = find_sites(model)
    by_key = site_table(sites)
    kinds: dict[str, list[tuple[int, AttentionSite]]] = {}
    for s in sites:
        for layer in s.layers:
            kinds.setdefault(s.kind, []).append((layer, s))
    out: dict[str, list[float]] = {}
    for key, values in spec.items():
        if isinstance(key, AttentionSite):
            key = key.path
        if key in by_key:
            site = by_key[key]
            out[site.path] = _as_row(site, values, str(key))
        elif key in kinds:
            layers = sorted(kinds[key], key=lambda ls: ls[0])
            if not isinstance(values, (list, tuple)):
                raise HeadwiseError(f"mask for kind {key!r} must be a list of rows (one list of 0/1 per layer), "
                                    f"got {values!r}")
            rows = list(values)
            if len(rows) != len(layers):
                raise HeadwiseError(f"mask for kind {key!r} has {len(rows)} rows; the model has {len(layers)} "
                                    f"{key} layers (one row of 0/1 per layer)")
            for (layer, site), row in zip(layers, rows):
                row = _as_row(site, row, f"{key} layer {layer}")
                if site.path in out and out[site.path] != row:
                    raise HeadwiseError(f"{site.name} is one module shared by layers {list(site.layers)}; "
                                        "its mask must be the same in each of them")
                out[site.path] = row
        else:
            raise HeadwiseError(f"mask key {key!r} is neither a site nor an attention kind of this model; "
                                f"kinds: {', '.join(kinds)}; sites: {', '.join(s.name for s in sites)}")
    return out


def apply_masks(model: nn.Module, spec: MaskSpec, name: str = "mask") -> dict[str, HeadMask]:
    """Attach (or update) a ``HeadMask`` per site named in ``spec``; returns ``{site path: mask}``.

    Validates everything first: a bad spec leaves the model untouched. Selects the ``headwise`` implementation
    so the masks run.
    """
    plan = resolve_masks(model, spec)
    sites = {s.path: s for s in find_sites(model)}
    masks = {}
    for path, row in plan.items():
        ops = ops_of(sites[path])
        op = ops.output[name] if ops is not None and name in ops.output else attach(
            sites[path], "output", name, HeadMask(sites[path].num_heads))
        op.mask.copy_(torch.tensor(row))
        masks[path] = op
    enable(model)
    return masks


def remove_masks(model: nn.Module, name: str = "mask", missing_ok: bool = False) -> None:
    """Detach the masks called ``name`` from every site (undoes ``apply_masks``); raises when there are none,
    unless ``missing_ok``."""
    detach_all(model, name, missing_ok)


def load_masks(path: str | Path) -> dict[str, Any]:
    """Read a ``MaskSpec`` from a ``.json`` or ``.yaml``/``.yml`` file."""
    path = Path(path)
    if not path.is_file():
        raise HeadwiseError(f"mask file not found: {path}")
    text = read_text(path)
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as err:
            raise HeadwiseError("reading YAML masks needs PyYAML: pip install pyyaml (or use a .json file)") from err
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:  # its own message spans lines: keep the problem and where
            mark = getattr(err, "problem_mark", None)
            where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
            problem = " ".join(str(getattr(err, "problem", None) or err).split())
            raise HeadwiseError(f"{where}: not valid YAML ({problem}); fix the mask file") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise HeadwiseError(f"{path}:{err.lineno}:{err.colno}: not JSON ({err.msg}); fix the mask file") from None
        except RecursionError:
            raise HeadwiseError(f"{path}: JSON nested too deeply; a mask file maps sites or kinds to 0/1 "
                                "lists") from None
    if not isinstance(data, dict):
        raise HeadwiseError(f"mask file {path} must hold a mapping of site or kind to 0/1 lists")
    if not data:
        raise HeadwiseError(f"mask file {path} is empty ({{}}): it would remove no head; give site or kind -> 0/1 "
                            "per head, e.g. {\"enc-self\": [[0, 1, 1, ...], ...]}")
    return data
