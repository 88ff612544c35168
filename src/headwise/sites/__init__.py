"""Attention sites: where heads become visible. ``find_sites(model)`` works for every registered family."""

from . import families as _families  # noqa: F401  (registers the built-in adapters)
from . import seq2seq as _seq2seq  # noqa: F401  (encoder-decoder adapters)
from .base import KINDS, AttentionSite, FamilyLayout, HeadProjection
from .registry import (families_with, family_layout, find_sites, recorded_sites, register_adapter, select_sites, site_by_path,
                       site_table, supported_families)
from .selection import Selection, selection_of

__all__ = ["KINDS", "AttentionSite", "FamilyLayout", "HeadProjection", "families_with", "family_layout", "find_sites", "recorded_sites",
           "register_adapter", "select_sites", "site_by_path", "site_table",
           "supported_families", "Selection", "selection_of"]
