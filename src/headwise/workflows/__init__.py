"""A verb's whole run as a library function, its result returned: the command line parses its options, loads the
model, calls one of these and saves what it returns (some write what a run must keep on its own: ``convert``'s
uptraining checkpoints, progress lines on stderr). They run tasks, plans and
recovery, so they sit above planning (tests/test_import_layers.py).

- ``kv_policy.kv_policy_experiment``: choose a per-head KV policy for a budget, measure it, verify it (a
  replaceable ``Verification``; default ``PasskeyCheck``);
- ``prune.prune``: remove heads by L0 gates, importance or a mask, with evaluation and recovery;
- ``convert.convert``: grouped-query or latent key/value conversion, calibrated, evaluated, optionally uptrained;
- ``compress.compress_heads``: collaborative heads with a trade-off curve, evaluation and recovery;
- ``apply_plan.apply_plan``: perform a planned edit, recover and evaluate;
- ``recovery.Recovery``: the recovery after an edit they share.

The names load on first use (``headwise.lazy``).
"""

from typing import TYPE_CHECKING

from ..lazy import attach as _lazy

if TYPE_CHECKING:
    from .apply_plan import apply_plan
    from .compress import compress_heads
    from .convert import ConvertSettings, convert
    from .kv_policy import KVPolicyRun, KVPolicySettings, PasskeyCheck, Verification, kv_policy_experiment
    from .prune import PruneRun, PruneSettings, prune
    from .record import model_costs, run_record
    from ..training.recovery import Recovery

__getattr__, __dir__ = _lazy(__name__, globals())
