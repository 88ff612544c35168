"""Attention sites: where heads become visible. ``find_sites(model)`` works for every registered family.

The names load on first use (``headwise.lazy``): ``headwise.sites.selection`` (``Selection``, ``KINDS``) imports
without torch; the first name used registers the built-in family adapters."""

from typing import TYPE_CHECKING

from ..lazy import attach as _lazy

if TYPE_CHECKING:
    from . import families as _families  # registers the built-in adapters
    from . import seq2seq as _seq2seq  # encoder-decoder adapters
    from .base import AttentionSite, FamilyLayout, HeadProjection
    from .registry import (families_with, family_layout, find_sites, recorded_sites, register_adapter, select_sites,
                           site_by_path, site_table, supported_families)
    from .selection import KINDS, Selection, selection_of

__getattr__, __dir__ = _lazy(__name__, globals())
