import json

import browser
import pytest

from headwise.cli import main

ARGV = ["analyze", "--limit", "24", "--importance", "gradient,ablation", "--ablation-texts", "6", "--examples", "1"]


@pytest.fixture(scope="module")
def analyzed(tmp_path_factory):
    """``headwise analyze`` run once on the packaged MiniLM: (its output folder, its argv)."""
    out = tmp_path_factory.mktemp("analyze") / "report"
    argv = [*ARGV, "--out", str(out)]
    assert main(argv) == 0
    return out, argv


def test_analyze_writes_report_and_stats_and_refuses_to_overwrite(analyzed, capsys):
    out, argv = analyzed
    stats = json.loads((out / "stats.json").read_text())
    assert stats["sentences"] == 24 and len(stats["sites"]) == 6
    assert {"importance_gradient", "importance_ablation", "confidence"} <= set(stats["heads"])
    assert all(len(row) == 12 for row in stats["heads"]["importance_ablation"])
    assert stats["importance"] == ["gradient", "ablation"]
    assert set(stats["seconds"]) == {"observe", "gradient", "ablation"} and min(stats["seconds"].values()) > 0
    assert (out / "report.html").stat().st_size > 20_000
    capsys.readouterr()
    assert main(argv) == 2
    assert "--force" in capsys.readouterr().err
    assert main([*argv, "--force"]) == 0


@pytest.mark.browser
def test_analyze_report_renders_in_chromium(analyzed):
    out, _ = analyzed
    stats = json.loads((out / "stats.json").read_text())
    page = browser.load(out / "report.html")  # the real MiniLM report, in headless Chromium
    assert page.attribute("data-hw-ready") == "1" and page.attribute("data-hw-errors") is None
    assert page.console == []
    assert page.count_class("hw-heatmap") >= len(stats["heads"])
    png = browser.screenshot(out / "report.html", out.parent / "screenshot.png")
    assert png.stat().st_size > 20_000


def test_analyze_defaults_to_gradient_importance_and_says_what_it_cost(tmp_path, capsys):
    """The default importance is the one that scales (one backward pass per batch); ablation only by name."""
    out = tmp_path / "report"
    assert main(["analyze", "--limit", "8", "--examples", "0", "--out", str(out)]) == 0
    stats = json.loads((out / "stats.json").read_text())
    assert stats["importance"] == ["gradient"] and "importance_ablation" not in stats["heads"]
    assert set(stats["seconds"]) == {"observe", "gradient"}
    printed = capsys.readouterr().out
    assert "importance: gradient (observe " in printed and "gradient " in printed.split("importance: gradient")[1]
