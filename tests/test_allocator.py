"""``headwise.allocator``: freed large tensors leave the process (glibc), bad settings are refused."""

from __future__ import annotations

import ctypes.util
import subprocess
import sys
import textwrap

import pytest

from headwise.allocator import return_freed_memory
from headwise.errors import HeadwiseError

# Many 2 MiB tensors, each followed by a small one that stays alive and pins the heap above it; then the large ones
# are freed. With glibc's default the threshold has risen to 2 MiB after the first free, the later ones come from
# the heap and stay resident; with a fixed 1 MiB threshold each is its own mapping, unmapped on free.
CHILD = textwrap.dedent("""
    import sys, torch
    from headwise.allocator import return_freed_memory, trim

    def anon_mb():
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024

    print("set", return_freed_memory(int(sys.argv[1])))
    warm = torch.ones(1 << 19); del warm  # the first 2 MiB block: mapped, then freed (raises glibc's threshold)
    before = anon_mb()
    big, small = [], []
    for _ in range(100):
        big.append(torch.ones(1 << 19))  # 2 MiB
        small.append(torch.ones(1 << 12))  # 16 KiB, kept
    del big
    if sys.argv[2:] == ["trim"]:
        print("trimmed", trim())
    print("kept_mb", anon_mb() - before)
""")


def _kept_mb(threshold: int, *then: str) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, str(threshold), *then], capture_output=True, text=True,
                         check=True)
    return float(out.stdout.split("kept_mb")[1])


@pytest.mark.skipif(not sys.platform.startswith("linux") or ctypes.util.find_library("c") is None,
                    reason="glibc's mallopt is Linux only")
def test_freed_large_tensors_leave_the_process():
    assert _kept_mb(1 << 20) < 20  # 100 × 2 MiB freed: only the small ones (≈ 1.6 MiB) stay
    assert _kept_mb(0) > 100  # the reference: glibc's default keeps the freed 2 MiB blocks on its heap


@pytest.mark.skipif(not sys.platform.startswith("linux") or ctypes.util.find_library("c") is None,
                    reason="glibc's malloc_trim is Linux only")
def test_trim_returns_freed_heap_between_live_chunks():
    """The freed 2 MiB blocks sit on the heap between the small live ones (not at its top): trim gives their
    pages back all the same."""
    assert _kept_mb(0, "trim") < 20


def test_bad_thresholds_are_refused(monkeypatch):
    with pytest.raises(HeadwiseError, match="32 MiB"):
        return_freed_memory(64 << 20)
    with pytest.raises(HeadwiseError, match="glibc"):
        return_freed_memory(-1)
    monkeypatch.setenv("HEADWISE_MMAP_THRESHOLD", "lots")
    with pytest.raises(HeadwiseError, match="HEADWISE_MMAP_THRESHOLD='lots'"):
        return_freed_memory()
    monkeypatch.setenv("HEADWISE_MMAP_THRESHOLD", "0")
    assert return_freed_memory() is False


def test_the_cli_says_when_the_threshold_cannot_take_effect(monkeypatch, capsys):
    """Where there is no glibc the setting is not silently dropped: the command line says so, once."""
    import ctypes.util

    from headwise.cli import main

    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    monkeypatch.setenv("HEADWISE_MMAP_THRESHOLD", "1048576")
    assert main(["sites", "--model", "/no/such/model"]) == 2  # any verb; this one stops at its bad model path
    err = capsys.readouterr().err
    assert err.count("HEADWISE_MMAP_THRESHOLD is set but has no effect here") == 1 and "no/such/model" in err
    monkeypatch.setenv("HEADWISE_MMAP_THRESHOLD", "0")
    assert main(["sites", "--model", "/no/such/model"]) == 2
    assert "HEADWISE_MMAP_THRESHOLD" not in capsys.readouterr().err
