"""Head mixing and swapping (MHR, Azov & Landau): alpha matrices with a nuclear-norm term, head swaps (manual
schedules and dynamic methods) as Trainer callbacks, head distances before/after mixing, and folding.

>>> add_mixers(model, MixingConfig())                          # identity alphas: outputs unchanged
>>> term = NuclearNormPenalty(model, NuclearNormTraining(gamma=1.0, start=0.3))  # a penalty and a callback
>>> finetune_stsb(model, tok, penalties=[term], callbacks=[term, SwapSchedule(model, "swaps.json")])
>>> fold_mixing(model)                                         # a plain model again

The names load on first use (``headwise.lazy``): ``.config`` and ``.declaration`` import without torch.
"""

from typing import TYPE_CHECKING

from ..lazy import attach as _lazy

if TYPE_CHECKING:
    from .alpha import MIXER_NAME, HeadMixer, add_mixers, alpha_table, mixers_of, remove_mixers
    from .config import MixingConfig, NuclearNormTraining
    from .distances import head_distances, pairwise, save_json
    from .dynamic import DynamicSwap, DynamicSwapConfig, analysis_metric, choose_swaps
    from .fold import fold_mixing
    from .method import Mixing  # registers the package's method
    from .penalty import NuclearNormPenalty
    from .schedule import SwapSchedule, parse_swap, read_schedule
    from .swap import HeadSwap, resolve, swap_heads, undo_swaps

__getattr__, __dir__ = _lazy(__name__, globals())
