"""headwise: find, measure and edit the attention heads of transformers models.

The verbs and their configs, one per method (each also has a ``headwise <verb>`` command); the packages
(``headwise.pruning``, ``headwise.mixing``, ...) hold the rest. ``headwise.apply(model, config)`` /
``headwise.remove(model, method)`` run any registered method (``headwise.contract``).
"""

from .version import __version__, check_transformers

check_transformers()  # a transformers outside the tested range is refused in one line, before any model code

from .analysis import AnalysisConfig, HeadStats, analyze
from .collaborative import CollaborativeConfig, compress
from .contract import Selection, apply, remove
from .conversion import convert_gqa, convert_latent
from .errors import HeadwiseError
from .tasks import evaluate_stsb, fidelity, get_task, recover
from .io import from_pretrained, save_pretrained
from .kvcache import KVGateConfig, KVPolicy, apply_kv_policy, kv_policy, remove_kv_policy
from .mechanisms import apply as replace_attention
from .mechanisms import remove as restore_attention
from .mixing import MixingConfig, add_mixers, fold_mixing, remove_mixers, swap_heads
from .models import load_model
from .planning import Budget, Plan, plan
from .pruning import (L0Config, add_l0_gates, apply_masks, prune_heads, prune_masked, remove_l0_gates,
                      remove_masks)
from .quantization import QuantizationConfig, quantize_attention, remove_quantization
from .runtime import add_gates, enable, remove_gates
from .sites import AttentionSite, find_sites, select_sites
from .training import train_kv_gates

__all__ = [
    "__version__", "HeadwiseError",
    # the method contract: one verb for every registered config (headwise.contract.METHODS)
    "apply", "remove", "Selection",
    # models, sites, persistence
    "load_model", "from_pretrained", "save_pretrained", "enable", "AttentionSite", "find_sites", "select_sites",
    # analysis
    "AnalysisConfig", "HeadStats", "analyze",
    # pruning
    "add_gates", "remove_gates", "apply_masks", "remove_masks", "L0Config", "add_l0_gates", "remove_l0_gates",
    "prune_heads", "prune_masked",
    # collaborative heads
    "CollaborativeConfig", "compress",
    # quantization
    "QuantizationConfig", "quantize_attention", "remove_quantization",
    # mixing
    "MixingConfig", "add_mixers", "remove_mixers", "fold_mixing", "swap_heads",
    # mechanisms
    "replace_attention", "restore_attention",
    # KV-cache conversion
    "convert_gqa", "convert_latent",
    # per-head KV cache
    "KVPolicy", "kv_policy", "apply_kv_policy", "remove_kv_policy", "KVGateConfig", "train_kv_gates",
    # planning
    "Budget", "Plan", "plan",
    # tasks
    "get_task", "evaluate_stsb", "fidelity", "recover",
]
