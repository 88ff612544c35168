"""Per-head statistics in one streaming pass, and head importance.

``analyze(model, tokenizer, texts)`` attaches an observer to every self-attention site, runs the texts once and
returns ``HeadStats``: sum-able accumulators (memory independent of the data size; merging is addition; under
``torch.distributed`` the texts are sharded and the sums all-reduced). ``gradient_importance`` (Michel et al.)
and ``ablation_importance`` give ``[rows, H]`` tables. Tables have one row per (site, layer): a module shared by
several layers (ALBERT) gives one row per layer.

``HeadStats.to_dict()`` / ``to_json(path)`` write ``stats.json``::

    {"headwise_stats": 1, "model": str, "data": str, "sentences": int, "tokens": int,
     "sites": [site.describe() per row; a shared module gives one row per layer: layers=[l], name "kind.l"],
     "heads": {metric: [[float per head] per row]},          # null where a row saw no data
     "metric_info": {metric: {"label": str, "description": str, "range": [lo, hi] | null,
                              "higher": "specialised" | "important" | null}},
     "histogram": {"edges": [101 floats], "counts": [[[100 floats, sum 1] per head] per row]},
     "similarity": {"attention_cosine" | "attention_l2" | "output_cosine" | "output_l2": [[[H floats] H] per row]},
     "examples": [{"text": str, "tokens": [str], "maps": [[[[Tk floats] per query] per head] per row]}]}

Metrics: ``confidence``, ``confidence_no_special``, ``mhr_base``, ``mhr_advanced``, ``entropy``, ``distance``,
``special``, ``self``, ``prev``, ``next``, ``sparsity@<t>`` per threshold, and ``importance_gradient`` /
``importance_ablation`` when computed (definitions: ``metrics.METRIC_INFO`` and ``importance``).

``head_roles(model, batches)`` finds Voita's positional, rare-token and (cross-attention) alignment-like heads
in every attention kind, encoder-decoders included (``roles``); ``analyze_seq2seq(model, batches, loss_fn=...,
loss_inputs=...)`` puts them next to gradient importance of a label loss for every head of an encoder-decoder.
"""

from .analyze import analyze
from .config import DEFAULT_THRESHOLDS, AnalysisConfig
from .importance import ablation_importance, gradient_importance
from .metrics import METRIC_INFO
from .roles import HeadRoles, RoleConfig, head_roles
from .rows import Row, rows_of
from .seq2seq import Seq2SeqStats, analyze_seq2seq
from .stats import HeadStats

__all__ = [
    "analyze", "AnalysisConfig", "DEFAULT_THRESHOLDS", "HeadStats", "gradient_importance", "ablation_importance",
    "METRIC_INFO", "Row", "rows_of", "head_roles", "HeadRoles", "RoleConfig",
    "analyze_seq2seq", "Seq2SeqStats",
]
