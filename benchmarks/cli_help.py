"""Wall time of ``headwise --help``, of every ``headwise VERB --help`` and of every sub-command's ``--help`` (``eval
lm``, ``convert gqa``, every ``edit METHOD``), each in a fresh Python process (what a user waits for), median of
``--repeats`` runs. The target is 0.3 s for every page: building the parser and any page imports neither torch nor
transformers (the methods' declarations and configs are light; tests/test_cli_help.py checks it).

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
TARGET_S = 0.3


def commands() -> list[list[str]]:
    """Every page: argv after ``headwise``, ``--help`` included."""
    pages = [["--help"]]
    for verb, parser in build_parser()._subparsers._group_actions[0].choices.items():
        pages.append([verb, "--help"])
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        pages += [[verb, name, "--help"] for name in (subs[0].choices if subs else ())]
    return pages


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
    rows, slowest = [], 0.0
    for argv in commands():
        median = statistics.median(wall_time(argv) for _ in range(args.repeats))
        slowest = max(slowest, median)
        target = "yes" if median <= TARGET_S else "**no**"
        rows.append(f"| `headwise {' '.join(argv)}` | {median:.2f} | {target} |")
        print(rows[-1], flush=True)
    text = "\n".join([
        "# `--help` wall time (benchmarks/cli_help.py)",
        "",
        f"Fresh `python -m headwise ... --help` processes, median of {args.repeats}; {cpu_name()}, "
        f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs. Target: ≤ {TARGET_S} s. Slowest page: "
        f"{slowest:.2f} s.",
        "",
        f"| command | seconds | ≤ {TARGET_S} s |",
        "|---|---:|---|",
        *rows,
        "",
    ])
    atomic_write_text(OUT, text)
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
