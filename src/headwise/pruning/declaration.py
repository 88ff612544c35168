"""The pruning family's methods as the tools that do not run them see them (``headwise.declaration``): gates,
fixed masks, L0 gates and physical head removal, which the planner tries (its head-removal axis)."""

from ..declaration import Declaration, Planned
from .config import GateConfig, L0Config, MaskConfig, PruneHeadsConfig

GATES = Declaration(name="gates", config=GateConfig, doc="docs/pruning.md",
                    examples=("headwise edit gates --kinds enc-self --out minilm-gated",))
MASKS = Declaration(name="masks", config=MaskConfig, doc="docs/pruning.md", examples=(
    "headwise edit masks --masks '{\"enc-self.0\": [1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]}' --out minilm-masked",))
L0 = Declaration(name="l0", config=L0Config, version=2,  # 2: training settings moved to L0Training
                 doc="docs/pruning.md", trained_by="headwise prune --strategy l0",
                 examples=("headwise edit l0 --gate-init 3 --out minilm-l0-gates   # gates open; headwise prune "
                           "trains them",))
PRUNE_HEADS = Declaration(
    name="prune_heads", config=PruneHeadsConfig, doc="docs/pruning.md",
    examples=("headwise edit prune_heads --heads '{\"enc-self.0\": [0, 1]}' --out minilm-pruned",),
    planned=Planned(order=10, role="heads", label="remove heads", rankings=("gradient", "l0"),
                    former=("prune",)))  # its name in plan format 1

DECLARATIONS = (GATES, MASKS, L0, PRUNE_HEADS)

# how ``headwise prune`` (``workflows.prune``) chooses the heads it removes, and the units importance masks: the
# package's vocabulary that the command line shows without torch
STRATEGIES = ("l0", "importance", "mask")
UNITS = ("query", "kv-group")
