"""``headwise compress`` on a tiny BERT: saved model, compression.json, a report that renders, clear errors."""

import json

import browser
import pytest
import torch
from tiny import tiny_inputs, tiny_model

import headwise
from headwise.collaborative import compress
from headwise.cli import main


@pytest.fixture(scope="module")
def compressed(tmp_path_factory):
    """``headwise compress --dk 10`` run once on a saved tiny BERT: (the tiny model's folder, the output folder)."""
    tmp_path = tmp_path_factory.mktemp("compress")
    source = tmp_path / "tiny"
    headwise.save_pretrained(tiny_model("bert"), source)
    out = tmp_path / "out"
    assert main(["compress", "--model", str(source), "--dk", "10", "--no-eval", "--out", str(out)]) == 0
    return source, out


def test_compress_writes_model_json_and_report(compressed, tmp_path, capsys):
    source, out = compressed
    assert main(["compress", "--model", str(source), "--dk", "0", "--no-eval", "--out", str(tmp_path / "o1")]) == 2
    assert "--dk 0: give a positive integer width" in capsys.readouterr().err and not (tmp_path / "o1").exists()
    summary = json.loads((out / "compression.json").read_text())
    assert summary["dk"] == 10 and summary["params_after"] < summary["params_before"]
    assert [c["dk"] for c in summary["curve"]] == [5, 10, 11, 16, 21, 32]
    assert summary["curve"][-1]["sites"][0]["weight_error"] == 0.0
    assert (out / "report.html").read_text().count('class="hw-fig hw-lines"') == 2
    reloaded = headwise.from_pretrained(out / "model")
    expected = headwise.from_pretrained(source)
    compress(expected, dk=10)
    inputs, _ = tiny_inputs("bert")
    with torch.no_grad():
        assert torch.equal(reloaded(**inputs).last_hidden_state, expected(**inputs).last_hidden_state)
    capsys.readouterr()
    assert main(["compress", "--model", str(source), "--dk", "10", "--no-eval", "--calibration",
                 str(tmp_path / "missing.txt"), "--out", str(tmp_path / "o2")]) == 2
    assert "calibration file not found" in capsys.readouterr().err
    assert main(["compress", "--model", str(source), "--dk", "10", "--recover", "distill", "--alpha", "3",
                 "--out", str(tmp_path / "o3")]) == 2
    assert "alpha 3" in capsys.readouterr().err and not (tmp_path / "o3").exists()
    assert summary["recovery"] == {"mode": "none"} and summary["metric_recovered"] is None


@pytest.mark.browser
def test_compress_report_renders_in_chromium(compressed):
    _, out = compressed
    page = browser.load(out / "report.html")
    assert page.attribute("data-hw-ready") == "1" and page.attribute("data-hw-errors") is None
    assert page.count_class("hw-lines") == 2
