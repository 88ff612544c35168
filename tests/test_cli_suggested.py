"""Commands the CLI suggests run as printed: the analysis report's `headwise plan` carries the model, task and data
of the analysis (not only the model), and the plan's `headwise apply` (plan.json, its report and its printed verdict)
runs as written: each one here is taken from what the previous command wrote and run verbatim (shlex.split) in the
same working folder, on a tiny BERT and a tiny STS-B."""

from __future__ import annotations

import html
import json
import re
import shlex
from argparse import Namespace

from test_planning import bert_dir, stsb_dir, tokenizer  # noqa: F401 (fixtures)

from headwise.cli import main
from headwise.cli.suggest import run_options, suggest


def suggested(page: str, verb: str) -> list[str]:
    """Every ``headwise VERB …`` command in a report's <code> spans, unescaped."""
    return [html.unescape(c) for c in re.findall(rf"<code>(headwise {verb} [^<]*)</code>", page)]


def run(command: str) -> int:
    argv = shlex.split(command)
    assert argv[0] == "headwise"
    return main(argv[1:])


def test_analyze_then_its_plan_then_the_plans_apply_run_as_printed(tmp_path, monkeypatch, capsys, bert_dir,  # noqa: F811
                                                                    stsb_dir):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    assert main(["analyze", "--model", str(bert_dir), "--task", "stsb", "--data", str(stsb_dir), "--max-length", "32",
                 "--limit", "16", "--out", "an"]) == 0
    plans = suggested((tmp_path / "an" / "report.html").read_text(), "plan")
    assert plans, "the analysis verdict suggests a plan"
    command = plans[0]
    for option in (f"--model {bert_dir}", "--task stsb", f"--data {stsb_dir}", "--max-length 32", "--limit 16"):
        assert option in command
    assert run(command) == 0
    printed = capsys.readouterr().out
    plan = json.loads((tmp_path / "headwise-plan" / "plan.json").read_text())
    apply = plan["command"]
    assert apply in printed and apply in suggested((tmp_path / "headwise-plan" / "report.html").read_text(), "apply")
    assert run(apply) == 0
    summary = json.loads((tmp_path / "headwise-applied" / "apply.json").read_text())
    assert summary["point"] == plan["recommended"] and summary["planned"] == summary["metric_edited"]


def test_suggestions_carry_what_says_how_the_model_loads_and_what_the_data_is():
    args = Namespace(model="my model", device="cpu", dtype="bfloat16", task="classification", data="genre.csv",
                     max_length=64, text_column="review", limit=100, batch_size=8, new_head=True, out="x", json=False)
    assert run_options(args) == ["--model", "my model", "--dtype", "bfloat16", "--task", "classification", "--data",
                                 "genre.csv", "--max-length", "64", "--text-column", "review", "--limit", "100"]
    assert suggest(["plan", "--budget", "heads=8"], args).startswith("headwise plan --budget heads=8 --model 'my model'")
    assert run_options(Namespace(device="cuda:1", model=None), ("model", "device")) == ["--device", "cuda:1"]
