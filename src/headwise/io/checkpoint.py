"""Save and reload modified models with one call.

A checkpoint is a transformers folder (``config.json`` + ``model.safetensors``) whose config carries
``headwise = {"version": 2, "journal": [...], "ops": [...], "source": ...}``: the journal of edits in the order they
happened (``{"method", "version", "config", "state"}``, replayed on the fresh model through the method registry:
``headwise.contract``), then the attached ops, and the model it was loaded from (``source``: where its tokenizer
is, when none is saved beside it). Format 1 (``"edits"``: ``{"kind": ...}`` records) still loads.
``architectures`` names the saved class, head included. The state dict is the model's own
(``model.state_dict()`` names, shared tensors stored once) and is loaded strictly.

A checkpoint with ops or journal entries that rebuild something also stores one scalar tensor named ``MARKER``: plain transformers
(``AutoModel.from_pretrained``) lists it as an unexpected weight in its load report, so loading such a folder
without headwise, which drops the edits, never passes in silence.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors.torch import load_model, save_model
from torch import nn
from transformers.initialization import no_init_weights

from ..contract import load_methods, replay, upgrade_edits
from ..errors import HeadwiseError
from ..runtime import enable
from ..runtime.ops import rebuild, saved_specs
from ..sites import find_sites, recorded_sites
from .files import atomic_dir

FORMAT_VERSION = 2
WEIGHTS = "model.safetensors"
MARKER = "headwise_checkpoint__edits_load_only_with_headwise_from_pretrained"


def save_pretrained(
    model: nn.Module, path: str | os.PathLike, tokenizer: Any = None, overwrite: bool = False
) -> Path:
    """Write ``model`` (with its ops and structural edits) and optionally its tokenizer to ``path``, atomically.

    Refuses a non-empty ``path`` unless ``overwrite``.
    """
    sites = find_sites(model)
    state = dict(getattr(model.config, "headwise", None) or {})
    state.update(version=FORMAT_VERSION, ops=[r for s in sites for r in saved_specs(s)])
    state.setdefault("journal", [])
    # where the tokenizer can be found if none is saved here (checked by models.load_model when reloading)
    source = state.get("source") or str(getattr(model.config, "name_or_path", "") or "")
    if source:
        state["source"] = source
    model.config.headwise = state
    model.config.architectures = [type(model).__name__]  # the class saved, head included
    with atomic_dir(path, overwrite) as tmp:
        model.config.save_pretrained(tmp)
        if getattr(model, "generation_config", None) is not None and model.can_generate():
            model.generation_config.save_pretrained(tmp)
        # an entry with state rebuilds something plain transformers would not (an entry without, e.g. GQA in a
        # family whose config holds the KV head count, loads as a plain model)
        marked = bool(state["ops"] or any(entry["state"] for entry in state["journal"]))
        if marked:
            model.register_buffer(MARKER, torch.ones(()))
        try:
            save_model(model, str(tmp / WEIGHTS), metadata={"format": "pt", "headwise": str(FORMAT_VERSION)})
        finally:
            if marked:
                delattr(model, MARKER)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
    return Path(path)


def save_native(model: nn.Module, path: str | os.PathLike, config: Any = None, tokenizer: Any = None,
                overwrite: bool = False) -> Path:
    """Write ``model`` with transformers' own ``save_pretrained``, atomically, under ``config`` (default: a copy of
    the model's) without the ``headwise`` record, so that plain transformers loads the folder. The model keeps its
    own config."""
    plain = copy.deepcopy(model.config if config is None else config)
    if hasattr(plain, "headwise"):
        del plain.headwise
    original, model.config = model.config, plain
    try:
        with atomic_dir(path, overwrite=overwrite) as tmp:
            model.save_pretrained(tmp)
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
    finally:
        model.config = original
    return Path(path)


def _model_class(config) -> type:
    names = config.architectures or []
    for name in names:
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    raise HeadwiseError(
        f"config.architectures={names!r} names no transformers class; re-save the model with "
        "headwise.save_pretrained from an instance of the class you want back"
    )


def from_pretrained(
    path: str | os.PathLike, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> nn.Module:
    """Rebuild a model saved by ``save_pretrained``: replay edits, attach ops, load weights strictly, select
    the ``headwise`` implementation. Returns the model in eval mode."""
    path = Path(path)
    if not (path / "config.json").is_file() or not (path / WEIGHTS).is_file():
        raise HeadwiseError(
            f"{path} is not a headwise checkpoint (need config.json and {WEIGHTS}); "
            "save one with headwise.save_pretrained, or load a plain model with headwise.load_model"
        )
    config = transformers.AutoConfig.from_pretrained(path)
    state = getattr(config, "headwise", None) or {}
    if state.get("version", FORMAT_VERSION) > FORMAT_VERSION:
        raise HeadwiseError(f"{path} was written by a newer headwise (format {state['version']}); upgrade headwise")
    with no_init_weights():
        model = _model_class(config)._from_config(config, attn_implementation="sdpa")
    if state.get("version", FORMAT_VERSION) < 2:  # format 1: edit records by kind
        state = {k: v for k, v in state.items() if k != "edits"} | {
            "version": FORMAT_VERSION, "journal": upgrade_edits(state.get("edits", []), str(path))}
    model.config.headwise = dict(state)
    load_methods()  # every method and op type registered, whichever headwise modules the caller imported
    replay(model, state.get("journal", []), str(path))
    ops = state.get("ops", [])
    by_path = recorded_sites(model, [record["site"] for record in ops], f"{path}: an op")
    for record in ops:
        rebuild(by_path[record["site"]], record)
    model.tie_weights()
    try:
        missing, unexpected = load_model(model, path / WEIGHTS, strict=False)
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error type for a damaged file
        if type(err).__module__.split(".")[0] != "safetensors" and not isinstance(err, OSError):
            raise
        raise HeadwiseError(f"{path / WEIGHTS} cannot be read ({str(err).splitlines()[0]}); the file is damaged or "
                            "truncated: save the model again") from None
    unexpected = [key for key in unexpected if key != MARKER]
    if missing or unexpected:
        raise HeadwiseError(
            f"{path}: weights do not match the rebuilt model (missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}); "
            "the checkpoint is damaged or was written by another tool"
        )
    model.to(device=device, dtype=dtype)
    return enable(model).eval()
