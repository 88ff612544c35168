"""Safe writes and reads: output is built in a temporary sibling and moved into place under a claim on the
destination, never clobbered without consent; text files are read as UTF-8 with errors naming the file and line.

Real disks: a destination that is a symlink is written through (the link stays, its target gets the new content);
a full disk, a read-only or unwritable folder, a name too long, or a path below a file is refused in one line
(``disk_errors``) with the old output intact and no temporary left. A finished folder carries its manifest
(``io.manifest``) and replaces the old one in one atomic exchange (``renameat2(RENAME_EXCHANGE)`` on Linux), so a
reader sees the old or the new folder; ``stable_read`` retries a read the exchange overtook.

Claims: a writer claims ``path`` by holding an exclusive ``flock`` on the sibling ``.<name>.lock`` for as long as
it writes (``claim_output``, taken early by ``check_writable_dir`` and kept until ``atomic_dir`` has moved the
output into place). A second writer of the same destination is refused at once, so of two concurrent writers
exactly one succeeds. The kernel drops the lock when its process dies, so a killed run never blocks the next one;
the next writer of the same destination removes the temporaries (``.<name>.tmp-*``) the killed run left.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from ..errors import HeadwiseError
from .manifest import write_manifest

T = TypeVar("T")
# errno -> (what happened, the fix), for the one line a failed write gives
DISK_ERRORS = {
    errno.ENOSPC: ("the disk is full", "free space there or choose another output folder"),
    errno.EDQUOT: ("the disk quota is exceeded", "free space there or choose another output folder"),
    errno.EROFS: ("the file system is read-only", "choose an output folder on a writable disk"),
    errno.EACCES: ("permission denied", "choose an output folder you may write"),
    errno.EPERM: ("permission denied", "choose an output folder you may write"),
    errno.ENAMETOOLONG: ("a name is too long for the file system", "choose a shorter output name"),
    errno.ENOTDIR: ("a part of the path is a file, not a folder", "choose an output path below a folder"),
    errno.EEXIST: ("a part of the path is a file, not a folder", "choose an output path below a folder"),
}
MARGIN = 16 * 1024**2  # bytes kept free beyond what a write needs (file system metadata, the manifest)

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


def _errno_of(err: BaseException) -> int | None:
    """The errno of an ``OSError``, or of the I/O error a safetensors error wraps (``… (os error 28)``)."""
    if isinstance(err, OSError):
        return err.errno
    if type(err).__module__.split(".")[0] == "safetensors":
        found = re.search(r"(?:os error |Os \{ code: )(\d+)", str(err))
        return int(found.group(1)) if found else None
    return None


@contextlib.contextmanager
def disk_errors(path: str | os.PathLike) -> Iterator[None]:
    """Turn a failed write under ``path`` (full disk, read-only, permission, name too long, a file in the way)
    into one line naming ``path`` and the fix; other errors pass unchanged."""
    try:
        yield
    except Exception as err:  # noqa: BLE001 - OSError or a library's wrapper of one, sorted by errno
        code = _errno_of(err)
        if code not in DISK_ERRORS:
            raise
        what, fix = DISK_ERRORS[code]
        raise HeadwiseError(f"cannot write {path}: {what} ({os.strerror(code)}); {fix} (any earlier output "
                            "there is left as it was)") from None


def _nearest_existing(path: str | os.PathLike) -> Path:
    """``path`` or its nearest ancestor that exists."""
    existing = Path(os.path.abspath(path))
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    return existing


def check_free_space(path: str | os.PathLike, size: int) -> None:
    """Refuse before writing ``size`` bytes under ``path`` when its disk has less than that plus ``MARGIN``
    free."""
    free = shutil.disk_usage(_nearest_existing(path)).free
    if free < size + MARGIN:
        raise HeadwiseError(f"cannot write {path}: it needs {(size + MARGIN) / 2**20:,.0f} MiB and its disk has "
                            f"{free / 2**20:,.0f} MiB free; free space there or choose another output folder")


def destination(path: str | os.PathLike) -> Path:
    """Where writing ``path`` really goes: the target of a symlink (written through, the link stays), else
    ``path``."""
    path = Path(path)
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def check_writable_dir(path: str | os.PathLike, overwrite: bool) -> Path:
    """Refuse a non-empty existing directory (or any existing file) unless ``overwrite``, and claim ``path`` for
    this process (``claim_output``) so that no other headwise run writes it meanwhile. Returns the destination
    (``destination``: a symlink's target)."""
    path = destination(path)
    _refuse_enclosing(path)
    if path.exists() and not path.is_dir():
        raise HeadwiseError(f"{path} exists and is not a directory; choose another output path")
    above = _nearest_existing(path.parent)
    if not above.is_dir():
        raise HeadwiseError(f"cannot write {path}: {above} is a file, not a folder; choose an output path below a "
                            "folder")
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
    with disk_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
    lock = _lock_path(path)
    while True:
        with disk_errors(path):
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


@contextlib.contextmanager
def claimed(path: str | os.PathLike) -> Iterator[Path]:
    """Hold the claim on ``path`` (``claim_output``) for the block: the single-writer rule for an output built in
    place rather than swapped in whole (a resumable training's folder, written step by step). Refuses, before the
    block, ``--out .`` and a destination another run is writing; releases the claim after unless it was held before.
    Yields the destination (``destination``: a symlink's target)."""
    path = destination(path)
    _refuse_enclosing(path)
    held = Path(os.path.abspath(path)) in _CLAIMS
    claim_output(path)
    try:
        yield path
    finally:
        if not held:
            release_output(path)


def release_output(path: str | os.PathLike) -> None:
    """Give up the claim on ``path`` (nothing if not held)."""
    path = Path(os.path.abspath(path))
    fd = _CLAIMS.pop(path, None)
    if fd is None:
        return
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_lock_path(path))
    os.close(fd)


def release_all_outputs() -> bool:
    """Give up every claim this process holds (the command line calls it when a verb ends, even on error). A SIGINT
    that arrives meanwhile waits until every claim is given up; returns whether one came (the caller stops then)."""
    with deferred_interrupt() as interrupted:
        for path in list(_CLAIMS):
            release_output(path)
    return interrupted[0]


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[list[bool]]:
    """While active (in the main thread), SIGINT only sets the yielded ``[flag]``; the previous handler comes back
    afterwards. For clean-up that must finish: the caller reads the flag and stops then."""
    import signal
    import threading

    flag = [False]
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def note(number: int, frame: object) -> None:
        flag[0] = True

    previous = signal.signal(signal.SIGINT, note)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


def _exchange(a: Path, b: Path) -> bool:
    """Swap the folders ``a`` and ``b`` in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where the system
    or file system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _move_into_place(tmp: Path, path: Path) -> None:
    """Put the finished ``tmp`` at ``path``: one exchange with an existing ``path`` (then the old one, now at
    ``tmp``, is removed), else a rename."""
    if path.exists() and _exchange(tmp, path):
        shutil.rmtree(tmp, ignore_errors=True)
        return
    old = None
    if path.exists():  # no exchange here: two renames, a moment without ``path`` (stable_read retries)
        old = tmp.with_name(f"{tmp.name}-old")
        path.rename(old)
    tmp.rename(path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, overwrite: bool = False, size: int = 0) -> Iterator[Path]:
    """Yield a temporary directory that replaces ``path`` only when the block succeeds, with its manifest
    (``io.manifest``) written last; ``path`` is claimed (``claim_output``) from here, or from an earlier
    ``check_writable_dir``, until it is in place. ``size``: the bytes the block will write, checked against the
    free space first. A symlink ``path`` is written through. Failed writes give one line (``disk_errors``)."""
    path = check_writable_dir(path, overwrite)
    claim_output(path)
    tmp = None
    try:
        with disk_errors(path):
            check_free_space(path, size)
            tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
            tmp.chmod(_default_mode(0o777))
            yield tmp
            check_writable_dir(path, overwrite)  # still ours to write: re-checked under the claim
            write_manifest(tmp)
            _move_into_place(tmp, path)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        release_output(path)


def stable_read(folder: str | os.PathLike, read: Callable[[], T], tries: int = 50) -> T:
    """``read()`` of ``folder`` while another process may replace it (``atomic_dir``): retried when the folder
    was replaced during the read (its inode or change time moved: a swap), so the result is the old or the new
    version whole; an error of a read that nothing overtook is raised as it is."""
    def identity() -> tuple[int, int, int] | None:
        try:
            info = os.stat(folder)
        except FileNotFoundError:
            return None
        return info.st_dev, info.st_ino, info.st_ctime_ns

    for attempt in range(tries):
        before = identity()
        try:
            result = read()
        except (OSError, ValueError):  # HeadwiseError included
            if identity() == before or attempt == tries - 1:
                raise
        else:
            if identity() == before:
                return result
        time.sleep(min(0.02 * (attempt + 1), 0.5))
    raise HeadwiseError(f"{folder} was replaced {tries} times while it was read; read it again once its writer "
                        "has finished")


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory (a symlink is written through;
    failed writes give one line: ``disk_errors``)."""
    path = destination(path)
    with disk_errors(path):
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
