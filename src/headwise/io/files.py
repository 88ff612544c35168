"""Safe writes: build output in a temporary sibling, then move it into place; never clobber without consent."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from ..errors import HeadwiseError


def _default_mode(base: int) -> int:
    """``base`` (0o666 files, 0o777 directories) less the process umask: what ``open``/``mkdir`` would give, where
    ``tempfile`` gives 0o600/0o700."""
    umask = os.umask(0)
    os.umask(umask)
    return base & ~umask


def check_writable_dir(path: str | os.PathLike, overwrite: bool) -> Path:
    """Refuse a non-empty existing directory (or any existing file) unless ``overwrite``."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise HeadwiseError(f"{path} exists and is not a directory; choose another output path")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise HeadwiseError(f"{path} is not empty; pass --force (overwrite=True) to replace it, or pick a new path")
    return path


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that replaces ``path`` only when the block succeeds."""
    path = check_writable_dir(path, overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        tmp.chmod(_default_mode(0o777))
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if path.exists():
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        path.rename(old)
    tmp.rename(path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, _default_mode(0o666))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
