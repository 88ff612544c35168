"""headwise: find, measure and edit the attention heads of transformers models."""

from .analysis import HeadStats, analyze
from .conversion import convert_gqa, convert_latent
from .errors import HeadwiseError
from .evaluation import evaluate_stsb, fidelity
from .io import from_pretrained, save_pretrained
from .mixing import MixingConfig, add_mixers, fold_mixing, swap_heads
from .models import load_model
from .pruning import L0Config, add_l0_gates, apply_masks, prune_heads, prune_masked
from .runtime import add_gates, enable
from .sites import AttentionSite, find_sites

__version__ = "0.1.0"

__all__ = [
    "HeadStats", "analyze",
    "HeadwiseError", "evaluate_stsb", "fidelity", "from_pretrained", "save_pretrained", "load_model", "prune_heads",
    "prune_masked", "apply_masks", "add_l0_gates", "L0Config", "MixingConfig", "add_mixers", "fold_mixing", "swap_heads",
    "add_gates", "enable", "AttentionSite", "find_sites", "convert_gqa", "convert_latent", "__version__",
]
