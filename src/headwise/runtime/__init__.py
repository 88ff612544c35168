"""The headwise attention runtime: ops attached to attention modules, run by one registered function.

The names load on first use (``headwise.lazy``): ``headwise.runtime.defaults`` imports without torch."""

from typing import TYPE_CHECKING

from ..lazy import attach as _lazy

if TYPE_CHECKING:
    from .attention import NAME, enable, headwise_attention
    from .gates import Gate, HeadGate, HeadMask, RowGate, add_gates, gates_of, remove_gates
    from .hard_concrete import HardConcreteGate
    from .moments import SiteMoments, site_moments, slices
    from .ops import HeadOp, HeadOps, add_observer, attach, detach, detach_all, ops_of
    from .scope import eval_mode, using_headwise

__getattr__, __dir__ = _lazy(__name__, globals())
