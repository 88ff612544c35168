"""``headwise kv-policy`` outside the repository: no shared/ folder and no --data. The default ranking calibrates on
synthetic prompts, perplexity is skipped with a line saying so, and summary.json says what each input was used for;
a --data that the ranking does not read is reported as such; a use that needs text refuses without one; the 'outside'
score calibrates on Python's own text, and on --data too when given."""

from __future__ import annotations

import json

import pytest
from test_kvcache_scores import saved_lm_and_text

from headwise.cli import main
from headwise.tasks import paths


@pytest.fixture
def no_shared(tmp_path, monkeypatch):
    """A working directory with no shared/ above it, $HEADWISE_DATA_DIR unset, and the lookup above the installed
    package cut off (this checkout has shared/ beside it)."""
    monkeypatch.delenv(paths.ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(paths, "data_roots", lambda: [])
    return tmp_path


def base_args(tmp_path) -> list[str]:
    saved_lm_and_text(tmp_path)
    return ["kv-policy", "--model", str(tmp_path / "lm"), "--kv-budget", "0.6", "--context", "160", "--sink", "2",
            "--window", "16", "--calibration-length", "160", "--eval-length", "100", "--measure-new", "2",
            "--eval-keys", "1", "--check", "passkey"]


def test_runs_without_any_data_and_says_what_it_skipped(no_shared, capsys):
    args = base_args(no_shared)
    assert main(args + ["--out", "out"]) == 0
    err = capsys.readouterr().err
    assert "no text (--data) given" in err and "perplexity skipped" in err
    summary = json.loads((no_shared / "out" / "summary.json").read_text())
    assert summary["perplexity"] is None and summary["inputs"]["data"] is None
    assert summary["inputs"]["data_used_for"] == [] and summary["inputs"]["perplexity"] is None
    assert summary["inputs"]["calibration"].startswith("synthetic passkey and fact-lookup prompts (filler)")
    assert summary["calibration"]["calibration"] == 0 and summary["calibration"]["passkey"] > 0
    assert summary["passkey_check"]["family"] == "numbers" and summary["inputs"]["passkey_check"] == "numbers prompts"
    assert summary["model"] == str(no_shared / "lm")


def test_data_the_ranking_does_not_read_is_reported(no_shared, capsys):
    args = base_args(no_shared)
    data = str(no_shared / "calib.txt")
    assert main(args + ["--no-measure", "--data", data, "--out", "out"]) == 0
    err = capsys.readouterr().err
    assert f"--data {data} is used only for perplexity (its last 10%) with --kv-ranking retrieval+lookup" in err
    summary = json.loads((no_shared / "out" / "summary.json").read_text())
    assert summary["inputs"]["data_used_for"] == ["perplexity (its last 10%)"]
    assert summary["inputs"]["perplexity"] == f"the last 10% of {data}" and summary["perplexity"] is not None
    assert main(args + ["--no-measure", "--no-perplexity", "--data", data, "--out", "unused"]) == 0
    assert f"--data {data} is not used by these options" in capsys.readouterr().err


def test_outside_calibrates_on_python_text_and_on_data_when_given(no_shared, capsys):
    """A ranking that reads 'outside' needs no --data: it measures it on Python's documentation and source (never
    the check's prose); --data, when given, is read beside them (its calibration passages first)."""
    args = base_args(no_shared) + ["--kv-ranking", "retrieval+lookup+outside", "--no-measure", "--no-perplexity"]
    assert main(args + ["--out", "plain"]) == 0
    assert "calibrates on synthetic prompts and Python's documentation and source" in capsys.readouterr().err
    plain = json.loads((no_shared / "plain" / "summary.json").read_text())
    assert plain["calibration"]["calibration"] == 4
    assert plain["inputs"]["calibration"].endswith("'outside' on 4 passages of 160 tokens of Python's docs and code")
    data = str(no_shared / "calib.txt")
    assert main(args + ["--data", data, "--out", "data"]) == 0
    assert "--data" in capsys.readouterr().err
    summary = json.loads((no_shared / "data" / "summary.json").read_text())
    assert summary["calibration"]["calibration"] == 8
    assert f"'outside' on 4 passages of {data} + 4 passages" in summary["inputs"]["calibration"]
    assert any(use.startswith("calibration of 'outside'") for use in summary["inputs"]["data_used_for"])
    assert summary["scores"] == "training-free" and summary["ranking"] == "retrieval+lookup+outside"
    # the data moved the score: the same ranking on other text gives other 'outside' values
    scores = [json.loads((no_shared / d / "scores.json").read_text())["per_query_head"]["outside"]
              for d in ("plain", "data")]
    assert scores[0] != scores[1]


@pytest.mark.parametrize("option", [["--calibration-families", "text"], ["--eval-family", "text"]])
def test_a_use_that_needs_text_refuses_without_one(no_shared, capsys, option):
    assert main(base_args(no_shared) + option + ["--out", "out"]) == 2
    err = capsys.readouterr().err
    assert "needs a text and none was given" in err and "pass --data FILE" in err
    assert not (no_shared / "out").exists()


def test_help_names_a_decoder_and_only_the_lm_task(capsys):
    assert main(["kv-policy", "--help"]) == 0
    page = " ".join(capsys.readouterr().out.split())
    assert "(default: smollm2-135m)" in page and "(default: minilm)" not in page
    assert "(default: lm, the only task kv-policy measures" in page
    assert main(["kv-policy", "--task", "stsb", "--out", "x"]) == 2
    assert "kv-policy measures a decoder-only KV cache, on the lm task only" in capsys.readouterr().err
