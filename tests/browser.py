"""Headless Chromium for tests: screenshots of a page and its DOM after load (with the report's error marks).

Chromium is required, not optional: without it the helpers raise and tell how to install it. The tests that use it
are marked ``browser``; ``make test`` installs Chromium or deselects them with the reason.
``python tests/browser.py`` prints the browser's path, or says how to install one and exits 1.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

CANDIDATES = ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars")
# Lines of Chromium's own log that report page problems (script errors, failed loads).
CONSOLE_PATTERN = re.compile(r"CONSOLE|Uncaught|ERR_FILE_NOT_FOUND|Failed to load", re.IGNORECASE)


class BrowserMissing(RuntimeError):
    """No Chromium binary on this machine."""


def find_chromium() -> str:
    """Path of a Chromium/Chrome binary, or :class:`BrowserMissing` saying how to install one."""
    for name in CANDIDATES:
        path = name if os.path.isabs(name) and os.access(name, os.X_OK) else shutil.which(name)
        if path:
            return path
    raise BrowserMissing("no Chromium found (tried " + ", ".join(CANDIDATES) + "); the report tests need a real "
                         "browser: install it with `apt-get install -y chromium` (Debian/Ubuntu)")


@dataclass
class PageRun:
    """What one headless load produced."""

    dom: str
    console: list[str]

    def attribute(self, name: str) -> str | None:
        """Value of an attribute on the ``<html>`` element after load, or ``None``."""
        match = re.search(r"<html\b[^>]*?\s" + re.escape(name) + r'="([^"]*)"', self.dom)
        return match.group(1) if match else None

    def count_class(self, cls: str) -> int:
        """Number of elements whose ``class`` attribute contains ``cls`` as a whole word."""
        return len(re.findall(r'class="(?:[^"]*\s)?' + re.escape(cls) + r'(?:\s[^"]*)?"', self.dom))


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="hw-chromium-") as profile:
        cmd = [find_chromium(), *FLAGS, f"--user-data-dir={profile}", *args]
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"Chromium did not finish within {timeout:.0f}s: {' '.join(cmd)}") from exc


def load(html: str | os.PathLike, timeout: float = 60) -> PageRun:
    """Open a local HTML file, let it load, and return the DOM (``--dump-dom``) and console lines."""
    url = Path(html).resolve().as_uri()
    proc = _run(["--enable-logging=stderr", "--v=0", "--virtual-time-budget=3000", "--dump-dom", url], timeout)
    if proc.returncode != 0 or "<html" not in proc.stdout:
        raise RuntimeError(f"Chromium failed to load {url} (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    console = [line for line in proc.stderr.splitlines() if CONSOLE_PATTERN.search(line)]
    return PageRun(dom=proc.stdout, console=console)


def screenshot(html: str | os.PathLike, png: str | os.PathLike, size: tuple[int, int] = (1400, 2400),
               timeout: float = 60) -> Path:
    """Render a local HTML file to a PNG of ``size`` (width, height) pixels; returns the PNG path."""
    png = Path(png).resolve()
    url = Path(html).resolve().as_uri()
    proc = _run([f"--screenshot={png}", f"--window-size={size[0]},{size[1]}", "--virtual-time-budget=3000", url],
                timeout)
    if not png.exists() or png.stat().st_size == 0:
        raise RuntimeError(f"Chromium wrote no screenshot of {url} (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return png


if __name__ == "__main__":
    import sys

    try:
        print(find_chromium())
    except BrowserMissing as err:
        sys.exit(str(err))
