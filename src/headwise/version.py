"""The package version (one place; ``headwise.__version__`` and the reports read it) and the transformers range it
is tested with (``pyproject.toml`` declares the same; ``tests/test_compat.py`` keeps the two in step).

The floor is the lowest release whose core works (docs/compat.md says why): ``import headwise`` refuses any
transformers outside ``[TRANSFORMERS_FLOOR, TRANSFORMERS_BELOW)`` with one line naming the range, before any model
code runs.
"""

from __future__ import annotations

import re
from importlib import metadata

from .errors import HeadwiseError

__version__ = "0.1.0"

TRANSFORMERS_FLOOR = (5, 24)
TRANSFORMERS_BELOW = (6,)
TRANSFORMERS_RANGE = (f">={'.'.join(map(str, TRANSFORMERS_FLOOR))},"
                      f"<{'.'.join(map(str, TRANSFORMERS_BELOW))}")


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string (``"5.24.0.dev0"`` → ``(5, 24, 0)``)."""
    found = re.match(r"\d+(\.\d+)*", version.strip())
    if found is None:
        raise HeadwiseError(f"transformers reports the version {version!r}, which has no release number; reinstall "
                            f"it: pip install 'transformers{TRANSFORMERS_RANGE}'")
    return tuple(int(part) for part in found.group(0).split("."))


def installed_transformers() -> str | None:
    """The installed transformers version, read from its metadata without importing it (None: not installed)."""
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


def check_transformers(version: str | None = None) -> None:
    """Refuse a transformers outside the tested range (``version``: the installed one by default)."""
    version = installed_transformers() if version is None else version
    if version is None:
        raise HeadwiseError(f"headwise needs transformers{TRANSFORMERS_RANGE}, which is not installed: "
                            f"pip install 'transformers{TRANSFORMERS_RANGE}'")
    if not TRANSFORMERS_FLOOR <= release(version) < TRANSFORMERS_BELOW:
        raise HeadwiseError(f"headwise needs transformers{TRANSFORMERS_RANGE} (tested: see docs/compat.md) but "
                            f"{version} is installed: pip install 'transformers{TRANSFORMERS_RANGE}'")
