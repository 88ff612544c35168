"""What a sealed folder's ``auto_map`` names: transformers' Auto classes (and so pipelines and lm-eval's ``--model
hf``) load an edited folder through ``headwise.from_pretrained`` when asked with ``trust_remote_code=True``.

A sealed folder (``io.checkpoint``: removed heads, latent keys/values, a KV policy, gates, …) carries
``load_with_headwise.py``, one import of this module, and ``"auto_map"`` pointing every Auto class at it. Without
``trust_remote_code`` transformers refuses the folder, naming it and its custom code (that file, whose docstring
says to use headwise); with it and headwise installed, ``AutoConfig`` gives the model's real config (``model_type``
back, ``auto_map`` kept) and ``AutoModel*`` the model ``headwise.from_pretrained`` rebuilds, edits included — a KV
policy included, which acts in ``generate()``'s cache only: a warning says so, since a plain forward (lm-eval's
log-likelihood scoring) attends to every token."""

from __future__ import annotations

import os
import warnings
from typing import Any

from ..errors import HeadwiseError

# keywords of transformers' loading that concern where files come from (a local folder: nothing to do)
HUB_KEYWORDS = frozenset({"_from_auto", "_from_pipeline", "_commit_hash", "name_or_path", "trust_remote_code",
                          "revision", "code_revision", "cache_dir", "force_download", "proxies", "token",
                          "local_files_only", "subfolder", "adapter_kwargs", "return_unused_kwargs", "config",
                          "low_cpu_mem_usage"})
POLICY_NOTE = ("{path} carries a KV policy, which acts in generate()'s cache: generation uses it, but a plain forward "
               "(e.g. lm-eval's log-likelihood scoring with --model hf) attends to every token; score through the "
               "policy with lm-eval's --model headwise (python -m headwise.clients.lm_eval)")


class HeadwiseConfig:
    """``AutoConfig`` of a sealed folder: its real config (``io.checkpoint.read_config``)."""

    @classmethod
    def register_for_auto_class(cls, auto_class: str = "AutoConfig") -> None:
        """Nothing to register: the real config class is transformers' own."""

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **kwargs: Any) -> Any:
        from ..io.checkpoint import read_config

        config = read_config(path)
        unused = {k: v for k, v in kwargs.items() if k not in HUB_KEYWORDS}
        for key, value in list(unused.items()):
            if hasattr(config, key) and key not in ("dtype", "torch_dtype"):  # config attributes given as keywords
                setattr(config, key, unused.pop(key))
        return (config, unused) if kwargs.get("return_unused_kwargs") else config


class HeadwiseModel:
    """``AutoModel*`` of a sealed folder: ``headwise.from_pretrained`` (every edit rebuilt)."""

    @classmethod
    def register_for_auto_class(cls, auto_class: str = "AutoModel") -> None:
        """Nothing to register: the model's class is transformers' own."""

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, *args: Any, **kwargs: Any) -> Any:
        """The edited model in eval mode; ``dtype`` (``torch_dtype``; ``"auto"``: the saved one) and ``device_map``
        (one device, e.g. ``"cuda:0"``; ``"auto"``: the first GPU if any) are honoured, other loading options
        refused rather than ignored."""
        import torch

        from ..io import from_pretrained
        from ..kvcache import policy_of
        from ..models import parse_dtype

        dtype = kwargs.pop("dtype", None) or kwargs.pop("torch_dtype", None)
        device = kwargs.pop("device_map", None) or "cpu"
        if isinstance(device, dict) and len(set(device.values())) == 1:  # {"": device}: the whole model on one
            device = next(iter(device.values()))
        if isinstance(device, int) and not isinstance(device, bool):
            device = f"cuda:{device}" if device >= 0 else "cpu"
        if device == "auto":
            device = "cuda:0" if torch.cuda.is_available() else "cpu"
        left = sorted(k for k, v in kwargs.items() if k not in HUB_KEYWORDS and v is not None)
        if args or left or not isinstance(device, (str, torch.device)):
            raise HeadwiseError(f"{path}: headwise.from_pretrained takes a dtype and one device, not "
                                f"{', '.join(left) or 'a device map over several devices'}; load it without them")
        model = from_pretrained(path, device=device, dtype=None if dtype == "auto" else parse_dtype(dtype))
        if policy_of(model) is not None:
            warnings.warn(POLICY_NOTE.format(path=path), stacklevel=2)
        return model
