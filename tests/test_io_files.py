"""Safe writes (headwise.io.files): permissions as a plain open/mkdir would give, no clobbering, no partial output."""

from __future__ import annotations

import os
import stat

import pytest

from headwise.errors import HeadwiseError
from headwise.io.files import atomic_dir, atomic_write_text
from headwise.io.manifest import MANIFEST


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_atomic_write_text_gives_umask_permissions(tmp_path, umask_022):
    target = tmp_path / "plot.svg"
    atomic_write_text(target, "<svg/>")
    assert target.read_text() == "<svg/>"
    assert mode(target) == 0o644


def test_atomic_dir_gives_umask_permissions_and_replaces_only_with_force(tmp_path, umask_022):
    out = tmp_path / "out"
    with atomic_dir(out) as tmp:
        (tmp / "a.txt").write_text("1")
    assert mode(out) == 0o755 and (out / "a.txt").read_text() == "1"
    with pytest.raises(HeadwiseError, match="--force"):
        with atomic_dir(out):
            pass
    with atomic_dir(out, overwrite=True) as tmp:
        (tmp / "b.txt").write_text("2")
    assert sorted(p.name for p in out.iterdir()) == ["b.txt", MANIFEST]


def test_failed_block_leaves_the_old_output_and_no_temporary(tmp_path):
    out = tmp_path / "out"
    with atomic_dir(out) as tmp:
        (tmp / "a.txt").write_text("1")
    with pytest.raises(RuntimeError):
        with atomic_dir(out, overwrite=True) as tmp:
            (tmp / "half.txt").write_text("partial")
            raise RuntimeError("boom")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert sorted(p.name for p in out.iterdir()) == ["a.txt", MANIFEST]
