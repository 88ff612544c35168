"""docs/quickstart.md cannot rot: every command in its ``bash`` blocks (``headwise …`` and ``python …`` lines) runs,
exactly as written, in a fresh folder, block after block (later commands read what earlier ones wrote). The SmolLM2
and Marian blocks need their data from ``shared/`` (WikiText-2, Multi30k and the Marian model) and say so when it is
missing; the MiniLM and classification blocks need nothing. After each block, each plan's suggested ``headwise apply``
runs as printed too, and the analysis verdict's suggested ``headwise plan`` is parsed as printed and must carry the
analysis run's model, task and data options (running it takes plan's full default settings: the analyze → plan →
apply chain runs verbatim on a tiny model in tests/test_cli_suggested.py). ``HEADWISE_TOUR_TIMES=FILE`` writes each command's wall
time there (how the times in the doc were measured)."""

from __future__ import annotations

import html
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
from shared_data import SHARED, require_shared

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "quickstart.md"
NEEDS = {"smollm2-135m": ("data/wikitext-2/valid.txt",),
         "multi30k-marian-de-en": ("data/multi30k", "models/multi30k-marian-de-en")}


def blocks() -> list[tuple[str, list[str]]]:
    """(heading, commands) of every ``bash`` block, in order."""
    text = DOC.read_text()
    out = []
    for match in re.finditer(r"^## (?P<title>.+?)$(?P<body>.*?)(?=^## |\Z)", text, re.M | re.S):
        for code in re.findall(r"```bash\n(.*?)```", match["body"], re.S):
            commands = [line.strip() for line in code.splitlines() if line.strip().startswith(("headwise ", "python "))]
            out.append((match["title"], commands))
    return out


def missing(commands: list[str]) -> list[str]:
    wanted = {need for name, needs in NEEDS.items() if any(name in c for c in commands) for need in needs}
    return sorted(n for n in wanted if SHARED is None or not (SHARED / n).exists())


def test_the_doc_has_a_block_per_named_model_ending_with_plan_apply_reload():
    found = blocks()
    assert len(found) == 4
    for _, commands in found:
        verbs = [shlex.split(c)[1] for c in commands]
        assert verbs[-3:] == ["plan", "apply", "eval"] and "--model tour/" in commands[-1]


@pytest.mark.slow
@pytest.mark.parametrize("index", range(4), ids=["minilm", "smollm2", "marian", "classification"])
def test_every_tour_command_runs(index, tmp_path_factory):
    title, commands = blocks()[index]
    lacking = missing(commands)
    if lacking:  # skipped in a clone without shared/ (see the Data paragraph of the tour); a failure under CI
        require_shared(*lacking)
    work = tmp_path_factory.getbasetemp() / "tour"  # one folder for all blocks, as a reader's shell
    work.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), HF_HUB_OFFLINE="1")
    if SHARED is not None:
        env.setdefault("HEADWISE_DATA_DIR", str(SHARED / "data"))
        env.setdefault("HEADWISE_MODELS_DIR", str(SHARED / "models"))
    times = {}

    def run(command: str) -> None:
        start = time.perf_counter()
        program = [sys.executable, "-m", "headwise"] if command.startswith("headwise ") else [sys.executable]
        done = subprocess.run([*program, *shlex.split(command)[1:]], cwd=work, env=env,
                              capture_output=True, text=True, timeout=1800)
        times[command] = round(time.perf_counter() - start, 1)
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"

    for command in commands:
        run(command)
    for command in suggested_plans(work, commands):  # the analysis verdicts' plan, parsed as printed
        check_suggested_plan(command, commands)
    for command in suggested_applies(work, commands):  # each plan's apply, run as printed
        run(command)
    if os.environ.get("HEADWISE_TOUR_TIMES"):
        path = Path(os.environ["HEADWISE_TOUR_TIMES"])
        previous = json.loads(path.read_text()) if path.is_file() else {}
        path.write_text(json.dumps(previous | times, indent=1))


def outputs(commands: list[str], verb: str) -> list[str]:
    """The ``--out`` folders of the block's ``verb`` commands."""
    return [shlex.split(c)[shlex.split(c).index("--out") + 1] for c in commands
            if shlex.split(c)[1] == verb and "--out" in c]


def suggested_plans(work: Path, commands: list[str]) -> Iterator[str]:
    """The ``headwise plan`` of each analysis report's verdict, as printed."""
    for out in outputs(commands, "analyze"):
        page = (work / out / "report.html").read_text()
        yield from [html.unescape(c) for c in re.findall(r"<code>(headwise plan [^<]*)</code>", page)][:1]


def check_suggested_plan(command: str, commands: list[str]) -> None:
    """``command`` parses as the CLI parses it and carries the analysis run's model, task and data options."""
    from headwise.cli import build_parser

    suggested = vars(build_parser().parse_args(shlex.split(command)[1:]))
    analysis = vars(build_parser().parse_args(next(shlex.split(c)[1:] for c in commands if " analyze " in c)))
    for option in ("model", "task", "data", "limit", "max_length", "max_tokens"):
        if analysis.get(option) is not None:
            assert suggested.get(option) == analysis[option], f"{command} drops --{option.replace('_', '-')}"


def suggested_applies(work: Path, commands: list[str]) -> Iterator[str]:
    """The ``headwise apply`` of each plan of the block (plan.json's ``command``, the one plan prints), each read
    just before it runs; the default output folder it writes (headwise-applied) is cleared between them."""
    for out in outputs(commands, "plan"):
        shutil.rmtree(work / "headwise-applied", ignore_errors=True)
        yield json.loads((work / out / "plan.json").read_text())["command"]
    shutil.rmtree(work / "headwise-applied", ignore_errors=True)
