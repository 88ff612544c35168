"""Persistence: one-call save and reload of modified models, and safe file writes and reads."""

from .checkpoint import from_pretrained, save_native, save_pretrained
from .plain import export_plain, plain_problem
from .files import atomic_dir, atomic_write_text, check_writable_dir, claim_output, read_text, release_output
from .json_text import json_text

__all__ = [
    "export_plain", "plain_problem", "from_pretrained", "save_native", "save_pretrained",
    "atomic_dir", "atomic_write_text", "check_writable_dir", "claim_output", "read_text", "release_output",
    "json_text",
]
