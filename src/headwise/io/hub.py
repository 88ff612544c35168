"""The one way headwise reaches the Hugging Face hub: a model named on the hub (``org/name``, ``gpt2``) becomes a
local snapshot folder before anything reads it, so transformers only ever reads local files.

Asking the hub is said on stderr first (which endpoint, for which model, how long it may take). The question is one
request with a timeout and no retries (``$HEADWISE_HUB_TIMEOUT`` seconds, default ``TIMEOUT``): a hub that does not
answer, refuses, or has no such model gives one line, never a silent wait. Then the files a model needs are
downloaded (config and tokenizer files, the safetensors weights, else the PyTorch ones) at the revision the hub
named, with huggingface_hub's own progress bars. With ``HF_HUB_OFFLINE`` set the local cache is read, or the model
is refused in one line. A process asks once per name.
"""

from __future__ import annotations

import os
import sys
from fnmatch import fnmatch

from ..errors import HeadwiseError

TIMEOUT = 20.0  # seconds a hub request may stay unanswered (one request, no retries)
TIMEOUT_ENV = "HEADWISE_HUB_TIMEOUT"
# what a model folder needs besides its weights: configs, tokenizers (json, vocab/merges text, sentencepiece)
NEEDED = ("*.json", "*.txt", "*.model", "*.spm", "*.tiktoken")
WEIGHTS = (("*.safetensors",), ("*.bin",))  # the first kind the repository holds is downloaded
SKIPPED = ("onnx/*", "openvino/*", "coreml/*", "*.onnx", "*.h5", "*.msgpack", "*.ot", "*.gguf", "tf_model*",
           "flax_model*", "rust_model*")

_FOLDERS: dict[str, str] = {}


def hub_timeout() -> float:
    """``$HEADWISE_HUB_TIMEOUT`` (seconds, > 0), else ``TIMEOUT``."""
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise HeadwiseError(f"${TIMEOUT_ENV}={text!r}: give a number of seconds above 0, e.g. {TIMEOUT:g}")
    return value


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "on", "yes")


def _hub_error(err: BaseException) -> bool:
    """Whether ``err`` comes from reaching the hub (the network, HTTP, or huggingface_hub's own errors)."""
    root = type(err).__module__.split(".")[0]
    return isinstance(err, OSError) or root.startswith(("httpx", "httpcore", "huggingface_hub", "requests", "urllib3"))


def patterns(files: list[str]) -> list[str]:
    """The files of a model repository worth downloading: configs and tokenizer files, and the weights of the first
    kind it holds (safetensors, else PyTorch's), nothing of other frameworks."""
    wanted = [*NEEDED]
    for kind in WEIGHTS:
        if any(fnmatch(f, p) for f in files for p in kind):
            wanted += kind
            break
    return [f for f in files if any(fnmatch(f, p) for p in wanted) and not any(fnmatch(f, p) for p in SKIPPED)]


def hub_folder(name: str) -> str:
    """The local snapshot folder of the hub model ``name``, downloaded when needed (see the module docstring);
    ``HeadwiseError`` in one line when the hub does not answer within the timeout, refuses, or lacks the model."""
    if name in _FOLDERS:
        return _FOLDERS[name]
    from huggingface_hub import HfApi, constants, snapshot_download

    if offline():
        try:
            folder = snapshot_download(name, local_files_only=True)
        except Exception as err:  # noqa: BLE001 - huggingface_hub's errors for a missing cache entry, sorted here
            if not _hub_error(err):
                raise
            raise HeadwiseError(f"model {name} is not in the local hub cache and HF_HUB_OFFLINE is set, so the hub is "
                                "not asked: unset HF_HUB_OFFLINE to download it, or pass a local folder") from None
        _FOLDERS[name] = folder
        return folder
    timeout = hub_timeout()
    print(f"headwise: asking the hub ({constants.ENDPOINT}) for {name} (waits at most {timeout:g} s: "
          f"${TIMEOUT_ENV})", file=sys.stderr, flush=True)
    try:
        info = HfApi().model_info(name, timeout=timeout)
    except Exception as err:  # noqa: BLE001 - the network's and the hub's errors, sorted here
        if not _hub_error(err):
            raise
        raise HeadwiseError(_why(name, err, timeout, constants.ENDPOINT)) from None
    files = patterns([s.rfilename for s in info.siblings or []])
    if not any(f.endswith("config.json") for f in files):
        raise HeadwiseError(f"the hub's {name} holds no config.json: it is not a transformers model; pass a model "
                            "repository or a local folder")
    print(f"headwise: downloading {len(files)} files of {name} (revision {info.sha[:10]}) into the hub cache",
          file=sys.stderr, flush=True)
    try:
        folder = snapshot_download(name, revision=info.sha, allow_patterns=files, etag_timeout=timeout)
    except Exception as err:  # noqa: BLE001 - as above
        if not _hub_error(err):
            raise
        raise HeadwiseError(_why(name, err, timeout, constants.ENDPOINT)) from None
    _FOLDERS[name] = folder
    return folder


def hub_name(folder: str) -> str | None:
    """The hub name whose snapshot ``folder`` is (this process's), or None."""
    return next((name for name, held in _FOLDERS.items() if held == folder), None)


def _why(name: str, err: BaseException, timeout: float, endpoint: str) -> str:
    """The one line for a failed hub request."""
    kind = type(err).__name__
    first = (str(err).strip().splitlines() or [kind])[0]
    fix = ("check the network and HF_ENDPOINT, set HF_HUB_OFFLINE=1 to use the local cache only, or pass a local "
           "model folder")
    if "Timeout" in kind:
        return f"the hub at {endpoint} did not answer within {timeout:g} s for {name} (${TIMEOUT_ENV}); {fix}"
    if kind in ("RepositoryNotFoundError", "RevisionNotFoundError"):
        return f"the hub at {endpoint} has no model {name} ({first}); check the name, or pass a local folder"
    if kind == "GatedRepoError":
        return f"{name} is gated on the hub: accept its terms and log in (hf auth login), or pass a local folder"
    return f"could not reach the hub at {endpoint} for {name}: {kind}: {first}; {fix}"
