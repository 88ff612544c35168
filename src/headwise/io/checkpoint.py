"""Save and reload modified models with one call.

A checkpoint is a transformers folder (``config.json`` + ``model.safetensors``) whose config carries
``headwise = {"version": 2, "journal": [...], "ops": [...], "source": ...}``: the journal of edits in the order they
happened (``{"method", "version", "config", "state"}``, replayed on the fresh model through the method registry:
``headwise.contract``), then the attached ops, and the model it was loaded from (``source``: where its tokenizer
is, when none is saved beside it). Format 1 (``"edits"``: ``{"kind": ...}`` records) still loads.
``architectures`` names the saved class, head included. The state dict is the model's own
(``model.state_dict()`` names, shared tensors stored once) and is loaded strictly.

A checkpoint with ops or journal entries that rebuild something (what plain transformers would load silently
wrong) is sealed: its ``config.json`` says ``"model_type": SEALED`` (the real one is ``headwise["model_type"]``), so
plain ``AutoModel*.from_pretrained`` fails with transformers' "model type `load-with-headwise.from_pretrained` …
not recognized". Earlier folders carried the scalar ``MARKER`` instead; it is still skipped on load.

Every folder carries its manifest (``io.manifest``, written by ``atomic_dir``); ``from_pretrained`` verifies it,
validates the record (one line per problem) and refuses non-finite weights, naming the tensor.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors.torch import load_model, save_model
from torch import nn
from transformers.initialization import no_init_weights

from ..contract import journal_problems, load_methods, replay, upgrade_edits
from ..errors import HeadwiseError
from ..runtime import enable
from ..runtime.ops import rebuild, saved_specs
from ..sites import find_sites, recorded_sites
from .dispatched import load_dispatched, load_ops, onloaded
from .files import atomic_dir, read_text, stable_read
from .manifest import verify_manifest

FORMAT_VERSION = 2
WEIGHTS = "model.safetensors"
MARKER = "headwise_checkpoint__edits_load_only_with_headwise_from_pretrained"  # format 2 before sealing
SEALED = "load-with-headwise.from_pretrained"  # config.json's model_type where plain transformers must refuse
LOADER = "load_with_headwise"  # the module a sealed folder carries, named by its auto_map (headwise.clients.auto)
AUTO_CLASSES = ("AutoModel", "AutoModelForCausalLM", "AutoModelForSeq2SeqLM", "AutoModelForSequenceClassification")


def auto_map() -> dict[str, str]:
    """The ``auto_map`` a sealed folder's config carries: every Auto class to the loaders of ``LOADER``."""
    return {"AutoConfig": f"{LOADER}.HeadwiseConfig", **{name: f"{LOADER}.HeadwiseModel" for name in AUTO_CLASSES}}


def loader_source() -> str:
    """The text of a sealed folder's ``load_with_headwise.py``: one import of ``headwise.clients.auto``."""
    return ('"""This folder holds a model edited by headwise (removed heads, a KV cache policy, latent keys/values, '
            'gates, ...),\nwhich only headwise rebuilds: load it with headwise.from_pretrained(folder), or with '
            "transformers' Auto classes\nand trust_remote_code=True while headwise is installed (pip install "
            'headwise): they call headwise.from_pretrained.\nThis file only imports those loaders."""\n\n'
            "from headwise.clients.auto import HeadwiseConfig, HeadwiseModel  # noqa: F401\n")


def state_bytes(model: nn.Module) -> int:
    """Bytes of ``model``'s state dict, shared tensors once: about what its weights file takes."""
    seen, total = set(), 0
    for tensor in model.state_dict().values():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tensor.shape) if not tensor.is_meta \
            else id(tensor)
        if key not in seen:
            seen.add(key)
            total += tensor.numel() * tensor.element_size()
    return total


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
    # an entry with state rebuilds something plain transformers would not (an entry without, e.g. GQA in a
    # family whose config holds the KV head count, loads as a plain model): such a folder is sealed
    sealed = bool(state["ops"] or any(entry["state"] for entry in state["journal"]))
    state.pop("model_type", None)
    if sealed:
        state["model_type"] = model.config.model_type
    model.config.headwise = state
    if getattr(model.config, "auto_map", None) == auto_map():  # ours, from a sealed folder: written below if sealed
        del model.config.auto_map
    model.config.architectures = [type(model).__name__]  # the class saved, head included
    with atomic_dir(path, overwrite, size=state_bytes(model)) as tmp:
        model.config.save_pretrained(tmp)
        if sealed:  # plain transformers refuses it, or loads it through headwise with trust_remote_code=True
            saved = json.loads((tmp / "config.json").read_text(encoding="utf-8"))
            (tmp / "config.json").write_text(json.dumps(saved | {"model_type": SEALED, "auto_map": auto_map()},
                                                        indent=2), encoding="utf-8")
            (tmp / f"{LOADER}.py").write_text(loader_source(), encoding="utf-8")
        if getattr(model, "generation_config", None) is not None and model.can_generate():
            model.generation_config.save_pretrained(tmp)
        with onloaded(model):  # a dispatched model's offloaded weights, read back for the file
            save_model(model, str(tmp / WEIGHTS), metadata={"format": "pt", "headwise": str(FORMAT_VERSION)})
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
        with atomic_dir(path, overwrite=overwrite, size=state_bytes(model)) as tmp:
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


def record_problems(record: Any) -> list[str]:
    """What is wrong with a saved ``headwise`` record (config.json): one line per problem, empty when none."""
    if not isinstance(record, dict):
        return [f"headwise is a {type(record).__name__ if record is not None else 'null'}, not a mapping "
                "(version, journal, ops, source)"]
    version = record.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        return [f"headwise.version is {version!r}; expected an int from 1 to {FORMAT_VERSION}"]
    if version > FORMAT_VERSION:
        return []  # refused by from_pretrained as written by a newer headwise
    problems = []
    if version == 1:
        edits = record.get("edits", [])
        if not isinstance(edits, list) or not all(isinstance(e, dict) and isinstance(e.get("kind"), str)
                                                  for e in edits):
            problems.append("headwise.edits must be a list of mappings, each with a 'kind' string")
    else:
        problems += journal_problems(record.get("journal", []), "headwise.journal")
    ops = record.get("ops", [])
    if not isinstance(ops, list) or not all(
            isinstance(op, dict) and all(isinstance(op.get(k), str) for k in ("site", "slot", "name", "type"))
            and isinstance(op.get("spec"), dict) for op in ops):
        problems.append("headwise.ops must be a list of mappings, each with site, slot, name and type strings and "
                        "a spec mapping")
    for key in ("source", "model_type"):
        if key in record and not isinstance(record[key], str):
            problems.append(f"headwise.{key} is {record[key]!r}; expected a string")
    return problems


def read_config(path: str | os.PathLike) -> transformers.PretrainedConfig:
    """The config of a folder ``save_pretrained`` wrote (its real ``model_type`` back where it was sealed), with
    its ``headwise`` record validated."""
    path = Path(path)
    try:
        raw = json.loads(read_text(path / "config.json"))
    except json.JSONDecodeError as err:
        raise HeadwiseError(f"{path / 'config.json'} is not valid JSON ({err}); save the model again") from None
    if not isinstance(raw, dict):
        raise HeadwiseError(f"{path / 'config.json'} holds a {type(raw).__name__}, not a mapping; save the model "
                            "again")
    if "headwise" in raw:
        problems = record_problems(raw["headwise"])
        if problems:
            raise HeadwiseError("\n".join(f"{path / 'config.json'}: {p}" for p in problems)
                                + "\nthe headwise record is damaged or was written by another tool; save the model "
                                "again")
        if raw["headwise"]["version"] > FORMAT_VERSION:
            raise HeadwiseError(f"{path} was written by a newer headwise (format {raw['headwise']['version']}); "
                                "upgrade headwise")
    if raw.get("model_type") == SEALED:
        real = raw.get("headwise", {}).get("model_type")
        if real is None:
            raise HeadwiseError(f"{path / 'config.json'} is sealed ({SEALED}) but its headwise record names no "
                                "model_type; save the model again")
        raw["model_type"] = real
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if raw.get("model_type") not in CONFIG_MAPPING:
        raise HeadwiseError(f"{path / 'config.json'}: model_type {raw.get('model_type')!r} is unknown to this "
                            f"transformers {transformers.__version__}; upgrade transformers or save the model again")
    return CONFIG_MAPPING[raw["model_type"]].from_dict(raw)


def file_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor in ``folder``'s safetensors files, read from their headers (no weights loaded)."""
    from safetensors import safe_open

    shapes = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), "pt") as handle:
            for key in handle.keys():
                shapes[key] = tuple(handle.get_slice(key).get_shape())
    return shapes


def config_mismatch(folder: Path, config: Any, expected: dict[str, tuple[int, ...]]) -> str | None:
    """Why ``folder``'s weights do not fit ``config``: the first tensor whose shape in the files differs from
    ``expected`` (the model ``config`` builds, by state-dict name; a prefix such as ``bert.`` on either side is
    matched), and the config fields holding the dimension that differs. None when no shape differs."""
    found = file_shapes(folder)
    for name, want in expected.items():
        candidates = [key for key in found if key == name or key.endswith("." + name) or name.endswith("." + key)]
        if not candidates or found[candidates[0]] == want:
            continue
        have = found[candidates[0]]
        if len(have) != len(want):
            dims = f"{len(have)} dimensions, not {len(want)}"
            fields = []
        else:
            axis = next(i for i, (a, b) in enumerate(zip(have, want)) if a != b)
            fields = [k for k, v in config.to_dict().items() if type(v) is int and v == want[axis]]
            dims = f"{have[axis]} along axis {axis}, where the config gives {want[axis]}"
        named = (f"config.json's {' or '.join(f'{k} = {want[axis]}' for k in fields)} does not fit the weights"
                 if fields else "config.json does not fit the weights")
        return (f"{folder}: {named}: {candidates[0]} is {list(have)} in the weights file but {list(want)} by the "
                f"config ({dims}); correct config.json to the weights' sizes, or copy the model again")
    return None


def check_finite(model: nn.Module, where: str) -> None:
    """Refuse parameters or buffers holding NaN or infinity (a damaged file, or gates or scores that diverged),
    naming the first few."""
    bad = [name for name, tensor in (*model.named_parameters(), *model.named_buffers())
           if tensor.is_floating_point() and not tensor.is_meta and not bool(torch.isfinite(tensor).all())]
    if bad:
        raise HeadwiseError(f"{where}: {len(bad)} tensors hold NaN or infinity ({', '.join(bad[:3])}"
                            f"{', …' if len(bad) > 3 else ''}); no result computed from them would mean anything: "
                            "save the model again from a run that did not diverge")


def from_pretrained(
    path: str | os.PathLike, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
    verify: bool | None = None, *, device_map: str | dict | None = None, max_memory: dict | None = None,
    offload_folder: str | os.PathLike | None = None,
) -> nn.Module:
    """Rebuild a model saved by ``save_pretrained``: verify its files (``io.manifest``: sizes, and sha256 when
    ``verify`` or below ``HASH_LIMIT``), replay edits, attach ops, load weights strictly, refuse non-finite ones,
    select the ``headwise`` implementation. A folder another process replaces meanwhile is read again
    (``stable_read``). ``device_map`` / ``max_memory`` / ``offload_folder``: Accelerate dispatch, as transformers
    takes them (``device`` is then unused; the ops live on each module's execution device: ``io.dispatched``).
    Returns the model in eval mode."""
    path = Path(path)
    if device_map is None and (max_memory or offload_folder):
        raise HeadwiseError("max_memory and offload_folder need device_map (e.g. device_map='auto')")
    dispatch = None if device_map is None else {"device_map": device_map, "max_memory": max_memory,
                                                "offload_folder": offload_folder}
    return stable_read(path, lambda: _load(path, device, dtype, verify, dispatch))


def _load(path: Path, device: str | torch.device, dtype: torch.dtype | None, verify: bool | None,
          dispatch: dict | None = None) -> nn.Module:
    if (path / "config.json").is_file():
        verify_manifest(path, verify)  # first: a listed file that is missing is named
    if not (path / "config.json").is_file() or not (path / WEIGHTS).is_file():
        raise HeadwiseError(
            f"{path} is not a headwise checkpoint (need config.json and {WEIGHTS}); "
            "save one with headwise.save_pretrained, or load a plain model with headwise.load_model"
        )
    config = read_config(path)
    state = getattr(config, "headwise", None) or {}
    empty = contextlib.nullcontext()
    if dispatch:  # parameters on meta until Accelerate places them (buffers built)
        from accelerate import init_empty_weights

        empty = init_empty_weights()
    with no_init_weights(), empty:
        model = _model_class(config)._from_config(config, attn_implementation="sdpa")
    if state.get("version", FORMAT_VERSION) < 2:  # format 1: edit records by kind
        state = {k: v for k, v in state.items() if k != "edits"} | {
            "version": FORMAT_VERSION, "journal": upgrade_edits(state.get("edits", []), str(path))}
    model.config.headwise = dict(state)
    load_methods()  # every method and op type registered, whichever headwise modules the caller imported
    replay(model, state.get("journal", []), str(path))
    if dispatch:
        model.tie_weights()
        model = load_dispatched(model, path / WEIGHTS, dtype=dtype, **dispatch)
    ops = state.get("ops", [])
    by_path = recorded_sites(model, [record["site"] for record in ops], f"{path}: an op")
    for record in ops:
        rebuild(by_path[record["site"]], record)
    if dispatch:
        load_ops(model, path / WEIGHTS, dtype)
        check_finite(model, str(path / WEIGHTS))
        return enable(model).eval()
    model.tie_weights()
    try:
        missing, unexpected = load_model(model, path / WEIGHTS, strict=False)
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error type for a damaged file
        if isinstance(err, RuntimeError) and "size mismatch" in str(err):
            expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
            raise HeadwiseError(config_mismatch(path, config, expected) or str(err).splitlines()[0]) from None
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
    check_finite(model, str(path / WEIGHTS))
    model.to(device=device, dtype=dtype)
    return enable(model).eval()
