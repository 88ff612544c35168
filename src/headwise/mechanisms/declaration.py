"""Attention replacement as the tools that do not run it see it (``headwise.declaration``): the method ``replace``
(formerly ``mechanism``); the planner tries a sliding local window on the layers it disturbs least."""

from ..declaration import Declaration, Planned
from .config import ReplaceConfig

REPLACE = Declaration(
    name="replace", config=ReplaceConfig, doc="docs/mechanisms.md",
    aliases=("mechanism",),  # its former name (saved records), also its name in plan format 1
    examples=("headwise edit replace --mechanism local --args '{\"window\": 16}' --out minilm-local",),
    planned=Planned(order=40, role="pair", label="efficient mechanism"))

DECLARATIONS = (REPLACE,)
