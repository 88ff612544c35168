"""Loading a model and its tokenizer by name or path (``hub.resolve_model``), on a device and dtype, with the head
its task needs; checks that a folder holds what its manifest and config say."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from ..errors import HeadwiseError
from .hub import looks_like_hub_name, resolve_model
from .registry import CONVERSION_RECORD, NAMED, conversion_cause

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


# files a saved tokenizer leaves in its folder (one of them at least)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model",
                   "source.spm", "sentencepiece.bpe.model", "tokenizer.model")


def check_device(device: str | torch.device) -> torch.device:
    """``device`` as a ``torch.device`` this build has; one line otherwise (``cuda`` on a CPU build, a GPU index
    beyond the count, an unknown name)."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        raise HeadwiseError(f"{device!r} is not a torch device; use cpu, cuda, cuda:1, mps") from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise HeadwiseError(f"device {device}: this torch build has no CUDA GPU (torch.cuda.is_available() is "
                            "False); use cpu")
    if parsed.type == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise HeadwiseError(f"device {device}: there are only {torch.cuda.device_count()} CUDA devices")
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        raise HeadwiseError(f"device {device}: MPS is not available here; use cpu")
    return parsed


def parse_dtype(name: str | torch.dtype | None) -> torch.dtype | None:
    if name is None or isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise HeadwiseError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}")
    return DTYPES[name]


def max_length_of(path: str, tokenizer: Any) -> int:
    """The sequence length the model was trained for (sentence-transformers config, else the tokenizer's, ≤ 512)."""
    st_config = Path(path) / "sentence_bert_config.json"
    if st_config.is_file():
        return int(json.loads(st_config.read_text())["max_seq_length"])
    return int(min(getattr(tokenizer, "model_max_length", 512) or 512, 512))


def load_tokenizer(name_or_path: str | None = None, model: nn.Module | None = None) -> Any:
    """The tokenizer of a model (the packaged MiniLM's by default), with ``model_max_length`` set to the
    length the model was trained for.

    A folder without tokenizer files takes the tokenizer of the model it was saved from when the checkpoint
    records one (``headwise.save_pretrained`` writes ``source``; a note says so), else it is refused: transformers
    would build a tokenizer that knows no word. With ``model``, a tokenizer whose ids do not fit the model's
    embeddings, or that covers less than half of them, is refused too."""
    from transformers import AutoTokenizer

    path = resolve_model(name_or_path)
    source = _tokenizer_source(path)
    try:
        with quiet_transformers():
            # never transformers' remote-code prompt (a sealed folder's auto_map): headwise reads the folder itself
            tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
    except (OSError, ValueError) as err:
        raise HeadwiseError(
            f"could not load a tokenizer for {name_or_path!r}: {str(err).splitlines()[0]} — save the tokenizer "
            "next to the model (headwise.save_pretrained(model, path, tokenizer=...))"
        ) from err
    tokenizer.model_max_length = max_length_of(source, tokenizer)
    if model is not None:
        check_vocabulary(model, tokenizer, name_or_path or path, converted_cause(Path(source)))
    return tokenizer


def optional_tokenizer(name_or_path: str | None, model: nn.Module) -> Any:
    """``load_tokenizer`` for work that can do without one: None for a folder that holds no tokenizer and whose
    source model is not recorded or not here (a tokenizer that is there but does not fit the model is still
    refused)."""
    folder = Path(resolve_model(name_or_path))
    if folder.is_dir() and not has_tokenizer_files(folder):
        try:
            return load_tokenizer(name_or_path, model)
        except HeadwiseError:
            return None
    return load_tokenizer(name_or_path, model)


def has_tokenizer_files(folder: Path) -> bool:
    return any((folder / name).is_file() for name in TOKENIZER_FILES)


def _tokenizer_source(path: str) -> str:
    """Where the tokenizer of ``path`` (a folder or hub name) is: the folder itself, or the model a checkpoint
    without tokenizer files was saved from (``config.headwise["source"]``)."""
    folder = Path(path)
    if not folder.is_dir() or has_tokenizer_files(folder):
        return path
    recorded = (json.loads((folder / "config.json").read_text()).get("headwise") or {}).get("source")
    if recorded and (recorded in NAMED or looks_like_hub_name(recorded)
                     or (Path(recorded).is_dir() and has_tokenizer_files(Path(recorded)))):
        print(f"headwise: note: {path} holds no tokenizer; using the tokenizer of {recorded}, the model it was "
              "saved from", file=sys.stderr)
        return resolve_model(recorded)
    raise HeadwiseError(f"{path} holds no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, …)"
                        + (f" and the model it was saved from ({recorded}) is not here" if recorded else "")
                        + "; save it with its tokenizer (headwise.save_pretrained(model, path, tokenizer=tokenizer)) "
                        "or copy the tokenizer files of its base model into it")


def converted_cause(folder: Path) -> str | None:
    """``conversion_cause`` for a folder that holds a GGUF conversion (``CONVERSION_RECORD``), else None."""
    try:
        recorded = json.loads((folder / CONVERSION_RECORD).read_text())
    except (OSError, ValueError):
        return None
    return conversion_cause(recorded.get("transformers") if isinstance(recorded, dict) else None, folder)


def check_vocabulary(model: nn.Module, tokenizer: Any, name: str, cause: str | None = None) -> None:
    """Refuse a tokenizer that does not belong to ``model``: ids beyond its embeddings, or fewer than half of
    them covered (a placeholder tokenizer). ``cause``: the likely cause and fix, when known (a GGUF conversion's)."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(embeddings, "num_embeddings", None) or getattr(model.config, "vocab_size", None)
    if not rows:
        return
    size = len(tokenizer)
    if size > rows or size < rows / 2:
        raise HeadwiseError(f"the tokenizer of {name} has {size:,} tokens but the model has {rows:,} token "
                            "embeddings: it is not this model's tokenizer; "
                            + (cause or "save the model with its own tokenizer "
                               "(headwise.save_pretrained(model, path, tokenizer=tokenizer))"))


def load_model(name_or_path: str | None = None, device: str | torch.device = "cpu",
               dtype: str | torch.dtype | None = None, with_tokenizer: bool = True, task: Any = None,
               new_head: bool = False, num_labels: int | None = None, *, device_map: str | dict | None = None,
               max_memory: dict | None = None, offload_folder: str | None = None, verify: bool | None = None,
               label_names: list[str] | None = None) -> tuple[nn.Module, Any]:
    """Load a model (and its tokenizer) with the ``headwise`` attention implementation selected.

    ``name_or_path``: a hub name, a local transformers folder, a folder written by ``headwise.save_pretrained``, or
    a named model (``minilm``, ``smollm2-135m``, ``multi30k-marian-de-en``); None means the packaged
    all-MiniLM-L6-v2. ``task`` (a name or ``headwise.tasks.Task``) picks the head: ``lm`` → causal LM,
    ``translation`` → sequence-to-sequence LM, ``classification`` → sequence classification, ``stsb`` or None →
    the base model. A checkpoint without the weights of that head is refused, unless ``new_head=True`` (a fresh,
    randomly initialised classification head with ``num_labels`` outputs, for fine-tuning; with ``label_names``
    one output per name, the names kept in the config's ``id2label``, so saved classifiers keep them).
    ``device_map`` / ``max_memory`` / ``offload_folder``: Accelerate dispatch, as transformers takes them (a
    model larger than one device, layers on several devices, the CPU or disk); ``device`` is then unused.
    A folder headwise wrote is checked against its manifest first (``headwise.io.manifest``: sizes, and sha256
    with ``verify=True`` or by default below 2 GiB) and refused when any weight is NaN or infinite.
    Returns ``(model in eval mode, tokenizer or None)``. Raises ``HeadwiseError`` for a path that is not a model,
    a family without an adapter or a missing head.
    """
    from ..io import from_pretrained
    from ..sites import find_sites

    head = "base" if task is None else _task_head(task)
    check_device(device)
    path = resolve_model(name_or_path)
    dtype = parse_dtype(dtype)
    shown = name_or_path or path
    try:
        dispatch = dispatch_kwargs(device_map, max_memory, offload_folder)
        if _saved_by_headwise(path):
            model = from_pretrained(Path(path), device=device, dtype=dtype, verify=verify, **dispatch)
            _check_checkpoint_head(model, shown, head)
        else:
            _check_architecture(path, name_or_path, head)
            extra = {"num_labels": num_labels} if new_head and num_labels else {}
            if new_head and label_names:
                extra = {"num_labels": len(label_names), "id2label": dict(enumerate(map(str, label_names))),
                         "label2id": {str(name): i for i, name in enumerate(label_names)}}
            model = _load_transformers(path, shown, head, dtype, verify, new_head, {**extra, **dispatch})
            model = (model if dispatch else model.to(device)).eval()
    except HeadwiseError:
        raise
    except Exception as err:  # noqa: BLE001 - transformers and safetensors raise many kinds; sorted here
        refusal = _loading_error(err, shown, path, head)
        if refusal is None:
            raise
        raise refusal from err
    find_sites(model)  # unsupported families fail here, before any work
    from ..io.hub import hub_name

    if hub_name(path) is not None:  # saved checkpoints record the hub name as their source, not a cache folder
        model.config.name_or_path = hub_name(path)
    return model, (load_tokenizer(path, model) if with_tokenizer else None)


def _load_transformers(path: str, shown: str, head: str, dtype: torch.dtype | None, verify: bool | None,
                       new_head: bool, keywords: dict[str, Any]) -> nn.Module:
    """A transformers checkpoint through the Auto class of ``head`` (``keywords``: labels and dispatch); a plain
    folder headwise wrote is checked against its manifest and for finite weights. Unused weights are noted, missing
    ones of the head refused (unless ``new_head``)."""
    import transformers

    from ..io.checkpoint import check_finite
    from ..io.files import stable_read
    from ..io.manifest import MANIFEST, verify_manifest
    from ..runtime import NAME

    local = Path(path)
    auto = getattr(transformers, HEAD_CLASSES[head])
    written = local.is_dir() and (local / MANIFEST).is_file()  # a plain folder headwise wrote

    def read() -> tuple[nn.Module, dict]:
        if written:
            verify_manifest(local, verify)
        with quiet_transformers():
            return auto.from_pretrained(path, attn_implementation=NAME, dtype=dtype, output_loading_info=True,
                                        **keywords)

    model, info = stable_read(local, read) if local.is_dir() else read()
    if written:
        check_finite(model, str(local))
    if info["unexpected_keys"]:
        unused = sorted(info["unexpected_keys"])
        print(f"headwise: note: {len(unused)} weights of {shown} are not used by "
              f"{type(model).__name__} (e.g. {unused[0]}); pass a task to load its head", file=sys.stderr)
    if info["missing_keys"] and not new_head:
        missing = sorted(info["missing_keys"])
        raise HeadwiseError(
            f"{shown} has no weights for the {head} head the task needs (missing: "
            f"{', '.join(missing[:3])}{', …' if len(missing) > 3 else ''}); use a checkpoint with that head"
            + (", or new_head=True (--new-head) to train a fresh one" if head == "classification" else ""))
    return model


def _loading_error(err: Exception, shown: str, path: str, head: str) -> HeadwiseError | None:
    """The one-line ``HeadwiseError`` a failed load raises in place of ``err``, naming the cause (damaged weights, a
    config that does not fit, no such head); None when ``err`` is not a loading error (it is raised as it is)."""
    local = Path(path)
    if type(err).__module__.split(".")[0] == "safetensors":
        return HeadwiseError(f"the weights of {shown} cannot be read ({str(err).splitlines()[0]}); "
                             "the file is damaged or truncated: copy or save the model again")
    if isinstance(err, RuntimeError) and local.is_dir() and ("mismatched_sizes" in str(err)
                                                             or "size mismatch" in str(err)):
        return HeadwiseError(_config_mismatch(local, head) or f"{path}: config.json does not fit the weights "
                             f"({str(err).splitlines()[0]}); correct config.json or copy the model again")
    if not isinstance(err, (OSError, ValueError)):
        return None
    if "Unrecognized configuration class" in str(err):
        return HeadwiseError(f"{shown} has no {head} head: transformers' {HEAD_CLASSES[head]} does not take its "
                             f"architecture; the task needs {HEAD_WHAT[head]}")
    return HeadwiseError(f"could not load model {shown!r} for the {head} head: {str(err).splitlines()[0]} — give a "
                         "local transformers folder (config.json + weights) or a hub name (needs internet)")


def _config_mismatch(folder: Path, head: str) -> str | None:
    """``io.checkpoint.config_mismatch`` of a plain folder: its weights against the model its config builds (on the
    meta device, nothing allocated) with ``head``."""
    import transformers

    from ..io.checkpoint import config_mismatch

    config = transformers.AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = getattr(transformers, HEAD_CLASSES[head]).from_config(config)
    return config_mismatch(folder, config, {k: tuple(v.shape) for k, v in model.state_dict().items()})


def _saved_by_headwise(path: str) -> bool:
    """Whether ``path`` is a folder ``headwise.save_pretrained`` wrote (its config carries a ``headwise`` record)."""
    from ..io.files import read_text

    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    try:
        return "headwise" in json.loads(read_text(config))
    except json.JSONDecodeError:
        raise HeadwiseError(f"{config} is not valid JSON; copy or save the model again") from None


def dispatch_kwargs(device_map: str | dict | None, max_memory: dict | str | None = None,
                    offload_folder: str | None = None) -> dict[str, Any]:
    """The Accelerate keywords of ``from_pretrained`` (empty without ``device_map``). ``max_memory`` may be a
    dict or the CLI's ``"cpu=2GiB,0=20GiB"``."""
    if device_map is None:
        if max_memory or offload_folder:
            raise HeadwiseError("--max-memory and --offload-folder need --device-map (e.g. --device-map auto)")
        return {}
    if isinstance(max_memory, str):
        try:
            pairs = [item.split("=", 1) for item in max_memory.split(",") if item.strip()]
            max_memory = {(int(k) if k.strip().isdigit() else k.strip()): v.strip() for k, v in pairs}
        except ValueError:
            raise HeadwiseError(f"--max-memory {max_memory!r}: write DEVICE=SIZE pairs, e.g. cpu=2GiB,0=20GiB") from None
    out: dict[str, Any] = {"device_map": device_map}
    if max_memory:
        out["max_memory"] = max_memory
    if offload_folder:
        out["offload_folder"] = offload_folder
    return out


HEAD_CLASSES = {"base": "AutoModel", "causal-lm": "AutoModelForCausalLM", "seq2seq": "AutoModelForSeq2SeqLM",
                "classification": "AutoModelForSequenceClassification"}


HEAD_WHAT = {"base": "a base model", "causal-lm": "a causal language model",
             "seq2seq": "an encoder-decoder (translation) model", "classification": "a sequence classifier"}
# transformers' class names of each head by model type (its auto mappings)
HEAD_MAPPINGS = {"base": "MODEL_MAPPING_NAMES", "causal-lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
                 "seq2seq": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
                 "classification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"}


def head_of_class(class_name: str, model_type: str) -> str | None:
    """The head (``base``, ``causal-lm``, ``seq2seq``, ``classification``) of a transformers class, or None."""
    from transformers.models.auto import modeling_auto

    for head, mapping in HEAD_MAPPINGS.items():
        names = getattr(modeling_auto, mapping).get(model_type, ())
        if class_name in ((names,) if isinstance(names, str) else tuple(names)):
            return head
    return None


def native_task(name_or_path: str | None) -> str | None:
    """The task whose head a model's own class carries (``config.architectures``): ``lm``, ``translation``,
    ``classification``, or None for a base model (e.g. for ``headwise sites``, which lists what is saved)."""
    from transformers import AutoConfig

    from ..io.checkpoint import read_config

    path = resolve_model(name_or_path)
    try:
        with quiet_transformers():
            config = read_config(path) if _saved_by_headwise(path) else AutoConfig.from_pretrained(path)
    except HeadwiseError:
        raise
    except (OSError, ValueError) as err:
        raise HeadwiseError(f"could not read the config of model {name_or_path!r}: {str(err).splitlines()[0]} — give "
                            "a local transformers folder or a hub name (needs internet)") from err
    head = next((head_of_class(name, config.model_type) for name in config.architectures or []), None)
    return next((task for task, h in TASK_HEADS.items() if h == head and h != "base"), None)


def _check_checkpoint_head(model: nn.Module, name: str, head: str) -> None:
    """Refuse a headwise checkpoint whose class lacks the head the task needs (e.g. saved as a base model)."""
    if head == "base":
        return
    if head_of_class(type(model).__name__, model.config.model_type) != head:
        raise HeadwiseError(f"{name} holds a {type(model).__name__}, which has no {head} head; the task needs "
                            f"{HEAD_WHAT[head]}: redo the edit with the task given (--task) so that its head is saved")


def _check_architecture(path: str, name: str | None, head: str) -> None:
    """Refuse early (before transformers builds and reports a half-loaded model) a causal LM for an
    encoder-decoder task and the reverse."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    seq2seq = bool(getattr(config, "is_encoder_decoder", False))
    if (head == "causal-lm" and seq2seq) or (head == "seq2seq" and not seq2seq):
        kind = "an encoder-decoder" if seq2seq else "not an encoder-decoder"
        raise HeadwiseError(f"{name or path} ({config.model_type}) is {kind}; the task needs {HEAD_WHAT[head]}")


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' load report silenced: headwise reports missing and unused weights itself."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)


# The head of each task by name (``headwise.tasks`` sits above this module; a test keeps the two in step).
TASK_HEADS = {"stsb": "base", "lm": "causal-lm", "translation": "seq2seq", "classification": "classification",
              "long": "causal-lm"}


def _task_head(task: Any) -> str:
    """The head a task needs: a ``headwise.tasks.Task``'s ``head``, or looked up by task name."""
    if isinstance(task, str):
        if task not in TASK_HEADS:
            raise HeadwiseError(f"unknown task {task!r}; use one of {', '.join(TASK_HEADS)}")
        return TASK_HEADS[task]
    return task.head
