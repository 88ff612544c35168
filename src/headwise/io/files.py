"""Safe writes and reads: output is built in a temporary sibling and moved into place under a claim on the
destination, never clobbered without consent; text files are read as UTF-8 with errors naming the file and line.

Claims: a writer claims ``path`` by holding an exclusive ``flock`` on the sibling ``.<name>.lock`` for as long as
it writes (``claim_output``, taken early by ``check_writable_dir`` and kept until ``atomic_dir`` has moved the
output into place). A second writer of the same destination is refused at once, so of two concurrent writers
exactly one succeeds. The kernel drops the lock when its process dies, so a killed run never blocks the next one;
the next writer of the same destination removes the temporaries (``.<name>.tmp-*``) the killed run left.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from ..errors import HeadwiseError

# destination (absolute) -> the open lock file this process holds for it
_CLAIMS: dict[Path, int] = {}


def _default_mode(base: int) -> int:
    """``base`` (0o666 files, 0o777 directories) less the process umask: what ``open``/``mkdir`` would give, where
    ``tempfile`` gives 0o600/0o700."""
    umask = os.umask(0)
    os.umask(umask)
    return base & ~umask


def _lock_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.lock")


def _refuse_enclosing(path: Path) -> None:
    """Refuse a destination that is the working directory or one of its parents (``--out .``): replacing it
    would delete the folder the run stands in."""
    absolute = Path(os.path.abspath(path))
    if not absolute.name or absolute == Path.cwd() or absolute in Path.cwd().parents:
        raise HeadwiseError(f"output {str(path)!r} is the working directory or contains it; name a new folder "
                            "(e.g. --out results) instead")


def check_writable_dir(path: str | os.PathLike, overwrite: bool) -> Path:
    """Refuse a non-empty existing directory (or any existing file) unless ``overwrite``, and claim ``path`` for
    this process (``claim_output``) so that no other headwise run writes it meanwhile."""
    path = Path(path)
    _refuse_enclosing(path)
    if path.exists() and not path.is_dir():
        raise HeadwiseError(f"{path} exists and is not a directory; choose another output path")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise HeadwiseError(f"{path} is not empty; pass --force (overwrite=True) to replace it, or pick a new path")
    if path.parent.is_dir():  # else claimed by atomic_dir, which creates the parents: nothing is written before
        claim_output(path)
    return path


def claim_output(path: str | os.PathLike) -> None:
    """Take the exclusive claim on ``path`` (a no-op if this process holds it), or refuse: another run is writing
    it. Removes the temporaries of killed runs that wrote ``path`` before."""
    import fcntl

    path = Path(os.path.abspath(path))
    if path in _CLAIMS:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = _lock_path(path)
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            raise HeadwiseError(f"another headwise run is writing {path} right now; wait for it to finish or "
                                "pick another output path") from None
        try:  # the holder before us may have removed the lock file after we opened it: then lock the new one
            same = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    _CLAIMS[path] = fd
    # ours now: temporaries of earlier writers of path are leftovers of killed runs (``.<name>.XXXXXXXX``: how
    # headwise 0.1 named them)
    for stale in [*path.parent.glob(f".{path.name}.tmp-*"), *path.parent.glob(f".{path.name}.{'[a-z0-9_]' * 8}")]:
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)


def release_output(path: str | os.PathLike) -> None:
    """Give up the claim on ``path`` (nothing if not held)."""
    path = Path(os.path.abspath(path))
    fd = _CLAIMS.pop(path, None)
    if fd is None:
        return
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_lock_path(path))
    os.close(fd)


def release_all_outputs() -> None:
    """Give up every claim this process holds (the command line calls it when a verb ends, even on error)."""
    for path in list(_CLAIMS):
        release_output(path)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that replaces ``path`` only when the block succeeds; ``path`` is claimed
    (``claim_output``) from here, or from an earlier ``check_writable_dir``, until it is in place."""
    path = check_writable_dir(path, overwrite)
    claim_output(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        tmp.chmod(_default_mode(0o777))
        yield tmp
        check_writable_dir(path, overwrite)  # still ours to write: re-checked under the claim
        old = None
        if path.exists():
            old = tmp.with_name(f"{tmp.name}-old")
            path.rename(old)
        tmp.rename(path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        release_output(path)


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


def read_text(path: str | os.PathLike) -> str:
    """The text of a UTF-8 file (gzip-compressed when it ends in ``.gz``); a file that is not UTF-8 is refused
    with its name and the line of the first bad byte."""
    path = Path(path)
    if path.suffix == ".gz":
        import gzip

        try:
            data = gzip.decompress(path.read_bytes())
        except (OSError, EOFError) as err:
            raise HeadwiseError(f"{path}: not a readable gzip file ({err}); give a .gz file or plain text") from None
    else:
        data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise HeadwiseError(f"{path}:{line}: not UTF-8 text (byte 0x{data[err.start]:02x}); convert the file to "
                            "UTF-8, e.g. iconv -f latin1 -t utf-8") from None
