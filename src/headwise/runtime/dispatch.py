"""Models dispatched by Accelerate (``device_map``, ``max_memory``, ``offload_folder``): where a site's ops live,
and which sites keep their weights offloaded.

A dispatched model's offloaded modules hold ``meta`` tensors and an ``AlignDevicesHook`` whose ``weights_map`` (CPU
memory or files in the offload folder) gives the values for each forward. Ops attached by headwise are small
(``[H]`` gates, ``[H, H]`` mixers, quantizer settings): they are never offloaded. They live on the module's
execution device (the device its hook runs it on), outside every hook and every ``weights_map``, so attaching
them changes nothing of the dispatch and detaching them leaves it as it was. Methods that rewrite weights refuse an
offloaded site before changing anything (``refuse_offloaded``); a class swap keeps Accelerate's wrapped forward
calling the new class (``set_class``).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from ..errors import HeadwiseError


def accelerate_hooks(module: nn.Module) -> list:
    """The Accelerate hooks on ``module`` itself (a ``SequentialHook`` unpacked); empty when none."""
    hook = getattr(module, "_hf_hook", None)
    if hook is None:
        return []
    return list(getattr(hook, "hooks", (hook,)))


def execution_device(module: nn.Module) -> torch.device | None:
    """The device ``module`` computes on: its Accelerate hook's execution device, else the device of its first
    tensor that is not ``meta``, else of its first tensor (``meta`` for a model without weights); None when it
    holds no tensor."""
    for hook in accelerate_hooks(module):
        device = getattr(hook, "execution_device", None)
        if device is not None:
            return torch.device(device)
    tensors = [*module.parameters(), *module.buffers()]
    real = next((t for t in tensors if not t.is_meta), None)
    if real is not None:
        return real.device
    return tensors[0].device if tensors else None


def offloaded(module: nn.Module) -> bool:
    """Whether Accelerate keeps some weights of ``module`` offloaded: a ``meta`` tensor whose module's hook fetches
    its value from a ``weights_map`` (CPU memory or the offload folder) for each forward."""
    return any(getattr(hook, "offload", False) and getattr(hook, "weights_map", None) is not None
               and any(t.is_meta for t in (*sub.parameters(recurse=False), *sub.buffers(recurse=False)))
               for sub in module.modules() for hook in accelerate_hooks(sub))


def refuse_offloaded(sites: Iterable, what: str) -> None:
    """Raise, in one line, when one of ``sites`` (``AttentionSite``) has offloaded weights that ``what`` would
    rewrite; says how to load the model instead. Called before anything changes."""
    names = [site.name for site in sites if offloaded(site.module)]
    if names:
        raise HeadwiseError(
            f"{what} rewrites attention weights that Accelerate keeps offloaded ({', '.join(names[:3])}"
            f"{', …' if len(names) > 3 else ''}, on disk or in CPU memory): load the model with a --max-memory "
            "(max_memory=) that keeps those layers on a device, or without --device-map, edit and save it; the "
            "saved folder then loads dispatched (headwise.from_pretrained(folder, device_map=...))")


def set_class(module: nn.Module, cls: type) -> None:
    """``module.__class__ = cls``, and where Accelerate's hook wrapped ``module``'s forward (it keeps the original
    as ``_old_forward``), the hook then calls ``cls``'s forward: a class swap is never bypassed on a dispatched
    model."""
    module.__class__ = cls
    if hasattr(module, "_old_forward"):
        module._old_forward = cls.forward.__get__(module)
