"""Tasks: what a model is evaluated and trained on — ``stsb`` (sentence similarity), ``lm`` (perplexity),
``translation`` (BLEU), ``classification`` (accuracy, F1, Matthews, Pearson/Spearman), ``long`` (a RULER-style
long-context suite) — behind one interface (``Task``: ``check``, ``evaluate``, ``examples``, ``loss``,
``calibration_inputs``); ``headwise.training`` trains on them.

``get_task("lm", data="valid.txt", max_length=1024)`` builds one; the task's ``head`` tells ``load_model`` which
transformers class to build. Tasks sit above the methods: methods never import them.
"""

from dataclasses import fields
from typing import Any

from ..errors import HeadwiseError, moved
from .base import HEADS, Task, TaskObjective, TaskOutputs, check_head, model_inputs
from ..batching import Examples, batches, check_context, collate, context_length
from .bleu import BleuMetric, BleuResult, corpus_bleu, evaluate_bleu, translate
from .classification import Classification
from .corpus import (ParallelCorpus, SyntheticGrammar, build_synthetic_corpus, read_corpus, train_tokenizer,
                     write_corpus)
from .embeddings import encode, ensure_encoder, fidelity, mean_pool
from .distillation import distillation_loss, embedding_distillation, logit_distillation
from .lm import LanguageModeling
from .long import LongContext
from .stsb import Stsb, StsbResult, evaluate_stsb, stsb_scores
from .stsb_data import StsbPairs, read_stsb, stsb_file
from .translation import Translation, read_parallel

TASKS: dict[str, type[Task]] = {"stsb": Stsb, "lm": LanguageModeling, "translation": Translation,
                                "classification": Classification, "long": LongContext}


FORMER = ("recover", "DistillationObjective", "CachedTeacher")  # now in headwise.training (issue 70)


def __getattr__(name: str) -> Any:
    if name not in FORMER:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .. import training

    return moved(training, name, __name__)


def get_task(name: str | Task, **options: Any) -> Task:
    """The task called ``name`` with ``options`` (its dataclass fields; ``None`` values are left at defaults)."""
    if isinstance(name, Task):
        return name
    if name not in TASKS:
        raise HeadwiseError(f"unknown task {name!r}; use one of {', '.join(TASKS)}")
    cls = TASKS[name]
    known = {f.name for f in fields(cls)}
    unknown = sorted(k for k, v in options.items() if v is not None and k not in known)
    if unknown:
        raise HeadwiseError(f"task {name} takes no option {unknown[0]!r}; it takes {', '.join(sorted(known))}")
    return cls(**{k: v for k, v in options.items() if v is not None and k in known})


__all__ = [
    "TASKS", "get_task", "Task", "HEADS", "TaskObjective", "TaskOutputs",
    "distillation_loss", "logit_distillation", "embedding_distillation", "check_head", "model_inputs", "Stsb",
    "LanguageModeling", "LongContext",
    "Translation", "Classification", "Examples", "batches", "collate", "check_context", "context_length",
    "read_parallel", "StsbPairs", "read_stsb", "stsb_file", "encode", "ensure_encoder", "fidelity", "mean_pool",
    "StsbResult", "evaluate_stsb", "stsb_scores", "corpus_bleu", "BleuMetric", "BleuResult", "translate",
    "evaluate_bleu", "ParallelCorpus", "SyntheticGrammar", "build_synthetic_corpus", "read_corpus", "write_corpus",
    "train_tokenizer",
]
