"""Persistence: one-call save and reload of modified models, and safe file writes."""

from .checkpoint import from_pretrained, record_edit, register_edit, save_native, save_pretrained
from .files import atomic_dir, atomic_write_text, check_writable_dir

__all__ = [
    "from_pretrained", "record_edit", "register_edit", "save_native", "save_pretrained",
    "atomic_dir", "atomic_write_text", "check_writable_dir",
]
