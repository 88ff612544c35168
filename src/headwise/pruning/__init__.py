"""Head pruning: fixed masks, importance schedules, Hard-Concrete L0 gates, and physical removal."""

from .finalize import head_factors, prune_masked
from .l0 import L0Config, L0Penalty, L0Training, add_l0_gates, gate_table, l0_gates, l0_keep, remove_l0_gates
from .keep import keep_l0_heads
from .masks import apply_masks, load_masks, remove_masks, resolve_masks
from ..runtime import HardConcreteGate, HeadMask
from .schedule import PruningCurve, PruningStep, importance_pruning, keep_counts, site_importance
from .surgery import prune_heads

from .method import GateConfig, MaskConfig, PruneHeadsConfig  # registers the package's methods
__all__ = ["GateConfig", "MaskConfig", "PruneHeadsConfig", "prune_heads", "prune_masked", "head_factors", "HeadMask", "apply_masks", "load_masks", "remove_masks",
           "resolve_masks", "remove_l0_gates",
           "HardConcreteGate", "L0Config", "L0Penalty", "L0Training",
           "add_l0_gates", "l0_gates", "gate_table", "l0_keep",
           "importance_pruning", "keep_counts", "site_importance", "PruningCurve", "PruningStep",
           "keep_l0_heads"]
