"""Tests on the team's real data in ``shared/`` (WikiText-2, Multi30k, the trained Marian model): a clone without
``shared/`` beside it skips them with the reason; CI (``CI=true``), which has ``shared/``, fails instead of skipping."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = next((p / "shared" for p in ROOT.parents if (p / "shared").is_dir()), None)


def require_shared(*relative: str) -> None:
    """Skip (or, under CI, fail) unless every ``shared/<relative>`` exists."""
    missing = [r for r in relative if SHARED is None or not (SHARED / r).exists()]
    if missing:
        reason = f"needs shared/{', shared/'.join(missing)} (the team's data folder beside the clone)"
        if os.environ.get("CI", "").lower() in ("1", "true"):
            pytest.fail(reason)
        pytest.skip(reason)
