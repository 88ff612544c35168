"""Head pruning: fixed masks, importance schedules, Hard-Concrete L0 gates, and physical removal.

The names load on first use (``headwise.lazy``): ``headwise.pruning.config`` and ``.declaration`` import without
torch; the first name used loads the package and registers its methods."""

from typing import TYPE_CHECKING

from ..lazy import attach as _lazy

if TYPE_CHECKING:
    from ..runtime import HardConcreteGate, HeadMask
    from .config import GateConfig, L0Config, L0Training, MaskConfig, PruneHeadsConfig
    from .finalize import head_factors, prune_masked
    from .keep import keep_l0_heads
    from .l0 import L0Penalty, add_l0_gates, gate_table, l0_gates, l0_keep, remove_l0_gates
    from .masks import apply_masks, load_masks, remove_masks, resolve_masks
    from .method import Gates, L0Gates, Masks, PruneHeads  # registers the package's methods
    from .schedule import PruningCurve, PruningStep, importance_pruning, keep_counts, site_importance
    from .surgery import prune_heads

__getattr__, __dir__ = _lazy(__name__, globals())
