"""Long steps report progress into logs: with stdout and stderr redirected to a file, ``eval`` and ``analyze`` write
periodic ``headwise: <step>: n/N ... left`` lines (interval from $HEADWISE_PROGRESS_INTERVAL), and nothing for steps
shorter than the interval."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from headwise.errors import HeadwiseError
from headwise.progress import progress_bar

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^headwise: (?P<desc>[^:]+): (?P<n>\d+)/(?P<total>\d+) \w+ \((?P<pct>\d+)%\), "
                  r"(?P<elapsed>[\d:]+) elapsed, (?P<left>[\d:?]+) left, ", re.M)


def run_logged(argv: list[str], log: Path, interval: str) -> str:
    env = dict(os.environ, HEADWISE_PROGRESS_INTERVAL=interval, PYTHONPATH=str(ROOT / "src"))
    with log.open("w") as out:  # one file for both streams, as `cmd > log 2>&1`
        done = subprocess.run([sys.executable, "-m", "headwise", *argv], stdout=out, stderr=subprocess.STDOUT,
                              env=env, timeout=600)
    text = log.read_text()
    assert done.returncode == 0, text
    return text


@pytest.mark.slow
def test_eval_and_analyze_write_periodic_progress_lines_into_a_log(tmp_path):
    text = run_logged(["eval", "stsb", "--limit", "200", "--batch-size", "8"], tmp_path / "eval.log", "0.001")
    lines = [m.groupdict() for m in LINE.finditer(text)]
    assert len(lines) >= 5 and {line["desc"] for line in lines} == {"STS-B"}
    counts = [int(line["n"]) for line in lines]
    assert counts == sorted(counts) and counts[-1] == int(lines[-1]["total"])  # counts rise to the total
    assert "\r" not in text and "Spearman" in text.splitlines()[-1]

    text = run_logged(["analyze", "--limit", "40", "--batch-size", "4", "--examples", "0", "--out",
                       str(tmp_path / "a")], tmp_path / "analyze.log", "0.001")
    descs = {m["desc"] for m in LINE.finditer(text)}
    assert "analysing heads" in descs and len(descs) >= 2  # observation, then the gradient-importance pass

    quiet = run_logged(["eval", "stsb", "--limit", "20"], tmp_path / "quiet.log", "600")
    assert not LINE.search(quiet)  # short steps stay silent at the default-like interval


def test_progress_lines_reach_a_non_terminal_stream(monkeypatch):
    stream = io.StringIO()  # not a terminal
    monkeypatch.setattr(sys, "stderr", stream)
    monkeypatch.setenv("HEADWISE_PROGRESS_INTERVAL", "0")
    for _ in progress_bar(range(4), desc="step", unit="batch"):
        pass
    lines = stream.getvalue().splitlines()
    assert lines[-1].startswith("headwise: step: 4/4 batch (100%), ") and all(LINE.match(x) for x in lines)
    stream.seek(0)
    stream.truncate(0)
    bar = progress_bar(range(2), desc="step", unit="edit")
    for i in bar:
        bar.set_postfix_str(f"last edit-{i} 3s", refresh=False)  # what the loop just did and what it cost
    last = stream.getvalue().splitlines()[-1]
    assert LINE.match(last) and last.endswith(("edit/s, last edit-1 3s", "s/edit, last edit-1 3s"))
    stream.seek(0)
    stream.truncate(0)
    for _ in progress_bar(range(4), desc="step", disable=True):
        pass
    assert stream.getvalue() == ""
    monkeypatch.setenv("HEADWISE_PROGRESS_INTERVAL", "soon")
    with pytest.raises(HeadwiseError, match="HEADWISE_PROGRESS_INTERVAL"):
        progress_bar(range(2), desc="step")


def test_training_writes_progress_lines_into_a_log(monkeypatch, tmp_path, capsys):
    """The Trainer's bar redraws itself with carriage returns; in a log it becomes periodic lines."""
    from transformers import TrainingArguments

    from headwise.training.trainer import HeadwiseTrainer

    class Objective(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(2))

        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": ((x - self.weight) ** 2).mean()}

    monkeypatch.setenv("HEADWISE_PROGRESS_INTERVAL", "0")
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=6, per_device_train_batch_size=2, logging_steps=3,
                             report_to="none", save_strategy="no", use_cpu=True)
    data = [{"x": torch.ones(2)} for _ in range(12)]
    HeadwiseTrainer(model=Objective(), args=args, train_dataset=data).train()
    out = capsys.readouterr()
    lines = [m.groupdict() for m in LINE.finditer(out.err)]
    assert "\r" not in out.err and lines and {line["desc"] for line in lines} == {"training"}
    assert lines[-1]["n"] == lines[-1]["total"] == "6" and "'loss'" in out.out
