"""Models by name or path: ``registry`` (the named models: packaged MiniLM, SmolLM2-135M converted from its GGUF,
Multi30k), ``hub`` (a name or path to a local folder) and ``load`` (model and tokenizer on a device, with the head
a task needs, checked). Every public name is here: ``from headwise.models import load_model`` keeps working."""

# re-exports: every public name of the three modules
from .registry import (DEFAULT_MODEL, SMOLLM2, SMOLLM2_PACKAGE, SMOLLM2_GGUF, MULTI30K, packaged_minilm, cache_dir,
    smollm2_gguf, packaged_smollm2, CONVERSION_RECORD, FINGERPRINT_BYTES, gguf_fingerprint, conversion_source,
    stale_conversion, conversion_cause, packaged_multi30k, NAMED)
from .hub import BARE_NAME, HUB_NAME, local_or_hub, looks_like_hub_name, resolve_model
from .load import (DTYPES, TOKENIZER_FILES, check_device, parse_dtype, max_length_of, load_tokenizer,
    optional_tokenizer, has_tokenizer_files, converted_cause, check_vocabulary, load_model, dispatch_kwargs,
    HEAD_CLASSES, HEAD_WHAT, HEAD_MAPPINGS, head_of_class, native_task, quiet_transformers, TASK_HEADS)

