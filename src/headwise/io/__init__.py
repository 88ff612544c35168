"""Persistence: one-call save and reload of modified models, and safe file writes and reads."""

from .checkpoint import from_pretrained, record_edit, register_edit, save_native, save_pretrained
from .files import atomic_dir, atomic_write_text, check_writable_dir, claim_output, read_text, release_output

__all__ = [
    "from_pretrained", "record_edit", "register_edit", "save_native", "save_pretrained",
    "atomic_dir", "atomic_write_text", "check_writable_dir", "claim_output", "read_text", "release_output",
]
