"""Global flags before the verb (as ``headwise --help`` shows them) act like the same flags after it, and scores
on a subset say so."""

from __future__ import annotations

import json

import pytest

from headwise.cli import main
from headwise.errors import HeadwiseError


@pytest.mark.parametrize("argv", [["--json", "sites"], ["sites", "--json"]])
def test_json_before_or_after_the_verb(argv, capsys):
    assert main(argv) == 0
    sites = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in sites] == [f"enc-self.{i}" for i in range(6)]


def test_debug_before_the_verb_shows_the_traceback(capsys):
    argv = ["eval", "stsb", "--data", "/no/such/sts-dev.tsv"]
    assert main(argv) == 2 and "not found" in capsys.readouterr().err
    with pytest.raises(HeadwiseError, match="not found"):
        main(["--debug", *argv])


def test_json_output_is_only_the_document_even_when_libraries_print(capsys, monkeypatch):
    """What a library prints before the verb's JSON (the Trainer's loss lines) goes to stderr."""
    from headwise.cli import sites

    run = sites.run

    def noisy(args):
        print("{'loss': 0.5, 'epoch': 1.0}")  # as transformers' Trainer prints its logs
        return run(args)

    monkeypatch.setattr(sites, "run", noisy)
    assert main(["--json", "sites"]) == 0
    captured = capsys.readouterr()
    assert len(json.loads(captured.out)) == 6 and "'loss'" in captured.err


@pytest.mark.slow
def test_eval_stsb_limit_says_the_score_is_on_a_subset(capsys):
    assert main(["eval", "stsb", "--limit", "30"]) == 0
    assert "first 30 of 1500 pairs (--limit 30): a subset" in capsys.readouterr().out
    assert main(["--json", "eval", "stsb", "--limit", "30"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["pairs"] == 30 and result["total_pairs"] == 1500
