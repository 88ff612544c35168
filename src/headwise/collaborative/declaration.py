"""Collaborative heads as the tools that do not run them see them (``headwise.declaration``): the planner tries
shares of each site's width on top of head removal."""

from ..declaration import Declaration, Planned
from .config import CollaborativeConfig

COLLABORATIVE = Declaration(
    name="collaborative", config=CollaborativeConfig, doc="docs/collaborative.md",
    examples=("headwise edit collaborative --dk 192 --out minilm-dk192",),
    planned=Planned(order=30, role="pair", calibrated=True, label="collaborative heads",
                    former=("dk",)))  # its name in plan format 1

DECLARATIONS = (COLLABORATIVE,)
