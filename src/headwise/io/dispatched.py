"""Save and reload models dispatched by Accelerate (``device_map``, ``max_memory``, ``offload_folder``).

``onloaded(model)``: for a block, the weights Accelerate keeps offloaded (``meta`` tensors whose hooks fetch them
from a ``weights_map``: CPU memory or the offload folder) are real tensors in CPU memory, so that
``save_pretrained`` writes the folder the whole model would; afterwards they are offloaded again.

``load_dispatched(model, weights, ...)``: a model built without weights (``init_empty_weights``, its journal
replayed) gets its weights from ``weights`` placed and hooked by Accelerate as ``device_map`` / ``max_memory``
say, disk-offloaded ones written to ``offload_folder``. The ops are attached afterwards, on each module's execution
device and outside every hook (``runtime.dispatch``), and ``load_ops`` reads their tensors.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

from ..errors import HeadwiseError
from ..runtime.dispatch import accelerate_hooks
from ..runtime.ops import ATTR, ops_of
from ..sites import find_sites


@contextmanager
def onloaded(model: nn.Module) -> Iterator[nn.Module]:
    """Inside the block every offloaded tensor of ``model`` holds its value (read from its hook's ``weights_map``,
    in CPU memory); after it, they are on ``meta`` again and the hooks fetch them as before."""
    from accelerate.utils import named_module_tensors, set_module_tensor_to_device

    placed = []
    try:
        for module in model.modules():
            for hook in accelerate_hooks(module):
                weights = getattr(hook, "weights_map", None)
                if not getattr(hook, "offload", False) or weights is None:
                    continue
                for name, tensor in named_module_tensors(module, include_buffers=hook.offload_buffers,
                                                         recurse=hook.place_submodules, remove_non_persistent=True):
                    if tensor.is_meta:
                        set_module_tensor_to_device(module, name, "cpu", value=weights[name])
                        placed.append((module, name))
        yield model
    finally:
        for module, name in placed:
            set_module_tensor_to_device(module, name, "meta")


def load_dispatched(model: nn.Module, weights: Path, device_map: str | dict, max_memory: dict | None = None,
                    offload_folder: str | os.PathLike | None = None, dtype: torch.dtype | None = None) -> nn.Module:
    """Load ``weights`` (a safetensors file) into ``model`` (built under ``init_empty_weights``, no ops attached)
    and dispatch it by ``device_map`` (a dict, or ``auto`` / ``balanced`` / ``balanced_low_0`` / ``sequential``
    under ``max_memory``); disk-offloaded weights go to ``offload_folder``. The file's op tensors are left for
    ``load_ops``; a model tensor the file lacks (tied copies aside) is refused, naming it."""
    from accelerate import dispatch_model, infer_auto_device_map
    from accelerate.utils import find_tied_parameters, get_balanced_memory, load_checkpoint_in_model
    from safetensors import safe_open

    with safe_open(str(weights), "pt") as handle:
        stored = set(handle.keys())
    tied = find_tied_parameters(model)
    missing = sorted(set(model.state_dict()) - stored - {name for group in tied for name in group})
    if missing:
        raise HeadwiseError(f"{weights.parent}: weights do not match the rebuilt model (missing {missing[:5]}); the "
                            "checkpoint is damaged or was written by another tool")
    no_split = getattr(model, "_no_split_modules", None)
    try:
        if isinstance(device_map, str):  # as transformers and Accelerate read these names
            if device_map not in ("auto", "balanced", "balanced_low_0", "sequential"):
                raise ValueError("choose auto, balanced, balanced_low_0, sequential or a dict of module → device")
            if device_map != "sequential":
                max_memory = get_balanced_memory(model, max_memory=max_memory, no_split_module_classes=no_split,
                                                 dtype=dtype, low_zero=device_map == "balanced_low_0")
            device_map = infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=no_split,
                                               dtype=dtype)
        load_checkpoint_in_model(model, str(weights), device_map=device_map, offload_folder=offload_folder,
                                 dtype=dtype, offload_state_dict="disk" in device_map.values(), strict=False)
        if "disk" in device_map.values():
            _offload_tied_copies(model, tied, device_map, Path(offload_folder))
        return dispatch_model(model, device_map=device_map, offload_dir=offload_folder,
                              skip_keys=getattr(model, "_skip_keys_device_placement", None))
    except ValueError as err:  # Accelerate's word for a bad map, or disk offload without a folder
        raise HeadwiseError(f"cannot dispatch {weights.parent} with device_map={device_map!r}: "
                            f"{str(err).splitlines()[0]}") from None


def _offload_tied_copies(model: nn.Module, tied: list[list[str]], device_map: dict, folder: Path) -> None:
    """Write to the offload folder the tied names the file stores once (a latent model's shared down projection,
    tied embeddings) whose module the map sends to disk: each offloaded module's hook reads its own names."""
    from accelerate.utils import OffloadedWeightsLoader, offload_weight, save_offload_index

    loader = OffloadedWeightsLoader(save_folder=str(folder))
    index: dict = {}
    for group in tied:
        stored = next((name for name in group if name in loader.index), None)
        for name in group:
            if name in loader.index or _device_of(name, device_map) != "disk":
                continue
            value = loader[stored] if stored is not None else next(
                model.get_parameter(n).detach() for n in group if not model.get_parameter(n).is_meta)
            offload_weight(value, name, str(folder), index)
    save_offload_index(index, str(folder))


def _device_of(name: str, device_map: dict) -> object:
    """The device ``device_map`` gives the tensor ``name`` (its longest listed module prefix)."""
    module = name
    while module and module not in device_map:
        module = module.rpartition(".")[0]
    return device_map.get(module)


def load_ops(model: nn.Module, weights: Path, dtype: torch.dtype | None = None) -> None:
    """Read the tensors of the ops attached to ``model`` (each site's ``headwise`` container) from ``weights``,
    strictly: every op tensor from the file, and no op tensor of the file left over."""
    from safetensors import safe_open

    with safe_open(str(weights), "pt") as handle:
        stored = {key for key in handle.keys() if f".{ATTR}." in key}
        loaded: set[str] = set()
        for site in find_sites(model):
            ops, prefix = ops_of(site), f"{site.path}.{ATTR}."
            if ops is None:
                continue
            values = {key[len(prefix):]: handle.get_tensor(key) for key in stored if key.startswith(prefix)}
            try:
                ops.load_state_dict(values, strict=True)
            except RuntimeError as err:
                raise HeadwiseError(f"{weights.parent}: the ops of {site.name} do not match the file "
                                    f"({str(err).splitlines()[1].strip()}); save the model again") from None
            if dtype is not None:
                ops.to(dtype=dtype)
            loaded |= {prefix + key for key in values}
    if stored - loaded:
        raise HeadwiseError(f"{weights.parent}: weights do not match the rebuilt model (unexpected "
                            f"{sorted(stored - loaded)[:5]}); the checkpoint is damaged or was written by another tool")
