"""Wall time of ``headwise --help``, of every ``headwise VERB --help`` and of every sub-command's ``--help`` (``eval
lm``, ``convert gqa``, ...), each in a fresh Python process (what a user waits for), median of ``--repeats`` runs.
The target is 1.5 s: building the parser imports neither torch nor transformers. ``edit METHOD --help`` builds the
method's options from its config class (which imports torch) and is listed apart, without the target.

    python benchmarks/cli_help.py            # writes benchmarks/results/cli_help.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import cpu_name

from headwise.cli import build_parser
from headwise.io import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "cli_help.md"
TARGET_S = 1.5


def commands() -> tuple[list[list[str]], list[list[str]]]:
    """(the pages with the 1.5 s target, the ``edit METHOD`` pages): argv after ``headwise``, ``--help`` included."""
    pages, methods = [["--help"]], []
    for verb, parser in build_parser()._subparsers._group_actions[0].choices.items():
        pages.append([verb, "--help"])
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        for name in (subs[0].choices if subs else ()):
            (methods if verb == "edit" else pages).append([verb, name, "--help"])
    return pages, methods


def wall_time(argv: list[str]) -> float:
    """Seconds of ``python -m headwise ARGV`` in a fresh process (it must exit 0)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "headwise", *argv], check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per page (the median is reported)")
    args = parser.parse_args()
    pages, methods = commands()
    rows, slowest = [], 0.0
    for argv in pages + methods:
        median = statistics.median(wall_time(argv) for _ in range(args.repeats))
        if argv in pages:
            slowest = max(slowest, median)
        target = ("yes" if median <= TARGET_S else "**no**") if argv in pages else "— (imports torch)"
        rows.append(f"| `headwise {' '.join(argv)}` | {median:.2f} | {target} |")
        print(rows[-1], flush=True)
    text = "\n".join([
        "# `--help` wall time (benchmarks/cli_help.py)",
        "",
        f"Fresh `python -m headwise ... --help` processes, median of {args.repeats}; {cpu_name()}, "
        f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs. Target: ≤ {TARGET_S} s. Slowest page with the "
        f"target: {slowest:.2f} s.",
        "",
        "| command | seconds | ≤ 1.5 s |",
        "|---|---:|---|",
        *rows,
        "",
    ])
    atomic_write_text(OUT, text)
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
