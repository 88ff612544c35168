"""The HTML report: SVG figures, the page builder, the analysis report, and the page in a real browser."""

from __future__ import annotations

import math
import random
import re
import xml.etree.ElementTree as ET

import pytest

from headwise.errors import HeadwiseError
from headwise.report import Report, analysis_report, svg, write_report

import browser

METRICS = ["confidence", "confidence_no_special", "mhr_base", "mhr_advanced", "entropy", "distance", "special",
           "self", "prev", "next", "sparsity@0.001", "importance_gradient", "importance_ablation"]


def _softmax_rows(rng: random.Random, tq: int, tk: int, causal: bool = False) -> list[list[float]]:
    rows = []
    for q in range(tq):
        ws = [math.exp(3 * rng.random()) if (not causal or k <= q) else 0.0 for k in range(tk)]
        s = sum(ws)
        rows.append([w / s for w in ws])
    return rows


def make_stats(layers: int = 3, heads: int = 4, seed: int = 0, ragged: bool = False) -> dict:
    """A schema-complete stats dict with random values: ``layers`` x ``heads``, two example sentences.

    With ``ragged`` the middle layer has one head fewer (as after pruning).
    """
    rng = random.Random(seed)
    counts = [heads - 1 if ragged and r == 1 else heads for r in range(layers)]
    sites = [{"name": f"enc-self.{r}", "path": f"encoder.layer.{r}.attention.self", "kind": "enc-self",
              "layers": [r], "num_heads": counts[r], "num_kv_heads": counts[r], "head_dim": 8, "hidden_size": 32,
              "positions": "absolute", "causal": False, "notes": [], "family": "bert"} for r in range(layers)]
    ranges = {"confidence": [0, 1], "confidence_no_special": [0, 1], "entropy": [0, None], "distance": [0, None],
              "special": [0, 1], "self": [0, 1], "prev": [0, 1], "next": [0, 1], "sparsity@0.001": [0, 1]}
    table = {}
    for m in METRICS:
        if m == "importance_ablation":  # signed, like a real ablation delta
            table[m] = [[rng.uniform(-0.2, 1.0) for _ in range(c)] for c in counts]
        elif m == "entropy":
            table[m] = [[rng.uniform(0.5, 3.0) for _ in range(c)] for c in counts]
        elif m == "distance":
            table[m] = [[rng.uniform(1, 8) for _ in range(c)] for c in counts]
        else:
            table[m] = [[rng.random() for _ in range(c)] for c in counts]
    table["prev"][0][1] = 0.93  # one clearly positional head
    table["special"][2][0] = 0.81  # and one attention sink
    info = {m: {"label": m.replace("_", " ").capitalize(), "description": f"Synthetic {m} values.",
                "range": ranges.get(m), "higher": "important" if m.startswith("importance") else
                ("specialised" if m in ("confidence", "confidence_no_special") else None)} for m in METRICS}
    edges = [10 ** (-8 + 8 * i / 100) for i in range(101)]

    def hist() -> list[float]:
        peak = rng.uniform(40, 95)
        raw = [math.exp(-((i - peak) / 8) ** 2) + 1e-3 for i in range(100)]
        return [v / sum(raw) for v in raw]

    def sim(c: int) -> list[list[float]]:
        m = [[1.0 if i == j else rng.uniform(-0.3, 0.95) for j in range(c)] for i in range(c)]
        return [[m[min(i, j)][max(i, j)] for j in range(c)] for i in range(c)]

    sentences = [("The cat sat on the mat.", ["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]"]),
                 ("A <b>bold</b> & risky claim.", ["[CLS]", "a", "<", "b", ">", "bold", "&", "risky", "claim", ".",
                                                   "[SEP]"])]
    examples = [{"text": text, "tokens": toks,
                 "maps": [[_softmax_rows(rng, len(toks), len(toks)) for _ in range(c)] for c in counts]}
                for text, toks in sentences]
    return {"headwise_stats": 1, "model": "tiny-bert <test>", "data": "synthetic & random", "sentences": 2,
            "tokens": 20, "sites": sites, "heads": table, "metric_info": info,
            "histogram": {"edges": edges, "counts": [[hist() for _ in range(c)] for c in counts]},
            "similarity": {k: [sim(c) for c in counts] for k in
                           ("attention_cosine", "attention_l2", "output_cosine", "output_l2")},
            "examples": examples}


def _xml(fragment: str) -> ET.Element:
    return ET.fromstring(fragment)  # raises on unescaped text or broken markup


# ---------------------------------------------------------------------------------------------- svg


def test_sequential_colormap_is_monotonic_in_lightness():
    lum = [svg.luminance(svg.value_color(v, 0, 10)) for v in range(11)]
    assert all(a < b for a, b in zip(lum, lum[1:]))
    assert svg.value_color(-5, 0, 10) == svg.value_color(0, 0, 10)  # clipped
    assert svg.value_color(None, 0, 1) == svg.MISSING_FILL
    assert svg.value_color(float("nan"), 0, 1) == svg.MISSING_FILL


def test_diverging_colormap_is_light_in_the_middle_and_dark_at_both_ends():
    lum = [svg.luminance(svg.value_color(v, -1, 1, "diverging")) for v in (-1, -0.5, 0, 0.5, 1)]
    assert lum[2] > 0.85 and lum[0] < lum[1] < lum[2] and lum[4] < lum[3] < lum[2]
    with pytest.raises(ValueError):
        svg.colormap("nope")


def test_heatmap_cells_tooltips_and_escaping():
    out = svg.heatmap([[0.0, 0.5], [1.0, None]], ["<s>", "a&b"], ["H0", "x<y"], "Title <&>", 0, 1)
    root = _xml(out)
    assert "hw-heatmap" in root.get("class")
    assert "<s>" not in out and "&lt;s&gt;" in out and "a&amp;b" in out and "Title &lt;&amp;&gt;" in out
    titles = [t.text for t in root.iter("{http://www.w3.org/2000/svg}title")]
    assert "&lt;s&gt;, H0: 0" in out and any(t == "a&b, H0: 1" for t in titles)
    assert any(t == "a&b, x<y: n/a" for t in titles)
    fills = re.findall(r'class="hw-cell"[^>]*fill="([^"]+)"', out)
    assert fills[0] == svg.value_color(0, 0, 1) and fills[2] == svg.value_color(1, 0, 1)


def test_heatmap_ragged_rows_show_missing_heads():
    out = svg.heatmap([[1, 2, 3], [4], []], ["L0", "L1", "L2"], ["H0", "H1", "H2"], "ragged")
    _xml(out)
    assert out.count('class="hw-cell"') == 4
    assert out.count("no head here") == 5
    assert "L1, H2: no head here" in out


def test_heatmap_without_data_still_renders():
    _xml(svg.heatmap([], [], [], "empty"))
    _xml(svg.heatmap([[None, None]], ["a"], ["b", "c"], "all missing"))


def test_bars_sort_top_and_negative_values():
    out = svg.bars([0.1, 0.9, -0.4, 0.5], ["a", "b", "c", "<d>"], "imp", sort=True, top=3, xlabel="Δ loss")
    root = _xml(out)
    assert "hw-bars" in root.get("class")
    bar_titles = re.findall(r'class="hw-bar"[^>]*><title>([^<]*)</title>', out)
    assert bar_titles == ["b: 0.9", "&lt;d&gt;: 0.5", "a: 0.1"]
    out = svg.bars([-1.0, 2.0, None], ["neg", "pos", "missing"], "signed")
    _xml(out)
    assert "n/a" in out


def test_lines_and_histograms():
    out = svg.lines({"magnitude": ([0, 10, 20], [0.9, 0.8, 0.5]), "random <x>": ([0, 10, 20], [0.9, 0.6, None])},
                    "heads removed (%)", "Spearman", "Pruning trade-off")
    root = _xml(out)
    assert "hw-lines" in root.get("class") and "random &lt;x&gt;" in out and out.count("<polyline") == 2
    _xml(svg.lines({"log": ([1, 10, 100], [1e-3, 1e-2, 1e-1])}, "bits", "error", "log-log", logx=True, logy=True))
    edges = [10 ** (-8 + i * 0.08) for i in range(101)]
    curve = [1 / 100] * 100
    out = svg.histogram_lines(edges, {"median": curve}, "hist", bands={"spread": ([0.005] * 100, [0.02] * 100)})
    root = _xml(out)
    assert "hw-hist" in root.get("class") and "10⁻⁸" in out and "<polygon" in out
    with pytest.raises(ValueError):
        svg.histogram_lines(edges, {"short": [0.5, 0.5]}, "bad")


def test_number_formatting_and_ticks():
    assert svg.fmt(None) == "n/a" and svg.fmt(0) == "0" and svg.fmt(0.12345) == "0.123" and svg.fmt(2e-6) == "2e-6"
    assert svg.nice_ticks(0, 1) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert [label for _, label in svg.log_ticks(1e-8, 1)] == ["10⁻⁸", "10⁻⁶", "10⁻⁴", "10⁻²", "1"]
    assert [label for _, label in svg.log_ticks(1, 8)] == ["1", "2", "5"]
    assert [svg.short(v) for v in (0.0021, -0.17, 12.34, 345.6, 0, 2e5, None)] == \
        ["2e-3", "-0.17", "12.3", "346", "0", "2e5", ""]
    assert all(len(svg.short(v)) <= 5 for v in (0.000123, -0.00999, 99.99, -12345.0, 0.5))


# ---------------------------------------------------------------------------------------------- builder


def test_builder_sections_toc_escaping_and_tables():
    rep = Report("Title <x>", meta={"model": "m&m"})
    a = rep.add_section("Results", intro="Intro with **bold** and `<code>`.")
    a.text("First <p>aragraph *em*.\n\n- one\n- two").table([["L0 H1", 0.123456, 3], ["<b>", None, "x"]],
                                                          ["head", "value", "n"])
    a.figure(svg.bars([1, 2], ["a", "b"], "b"), "caption & more").grid([svg.bars([1], ["a"], "c"), ("<svg/>", "cap")])
    rep.add_section("Results")  # same title: unique anchors
    html = rep.render()
    assert html.startswith("<!DOCTYPE html>") and "Title &lt;x&gt;" in html and "m&amp;m" in html
    assert 'href="#results"' in html and 'href="#results-2"' in html and 'id="results-2"' in html
    assert "<strong>bold</strong>" in html and "<code>&lt;code&gt;</code>" in html and "<em>em</em>" in html
    assert "First &lt;p&gt;aragraph" in html and "<li>one</li>" in html
    assert '<td class="hw-num">0.1235</td>' in html and "<td>&lt;b&gt;</td>" in html and "<td>None</td>" in html
    assert html.count('class="hw-grid"') == 1 and "caption &amp; more" in html
    assert "<script>" in html and "http://" not in html.replace("http://www.w3.org/2000/svg", "")


def test_write_is_atomic_and_refuses_to_clobber(tmp_path):
    rep = Report("r")
    rep.add_section("s").text("hello")
    path = rep.write(tmp_path / "new" / "dir")
    assert path.name == "report.html" and "hello" in path.read_text(encoding="utf-8")
    with pytest.raises(HeadwiseError, match="already exists"):
        rep.write(path.parent)
    rep.add_section("t").text("again")
    assert "again" in rep.write(path.parent, overwrite=True).read_text(encoding="utf-8")
    assert sorted(p.name for p in path.parent.iterdir()) == ["report.html"]  # no temporary files left
    (tmp_path / "file").write_text("x")
    with pytest.raises(HeadwiseError, match="not a directory"):
        rep.write(tmp_path / "file")


# ---------------------------------------------------------------------------------------------- analysis


SECTIONS = ["Verdict", "How to read this page", "Per-head metrics", "Most important heads", "Top and bottom heads",
            "Positional heads", "Attention weight distributions", "Head similarity", "Attention maps"]


def test_analysis_report_has_every_section_and_metric():
    stats = make_stats()
    rep = analysis_report(stats)
    assert [s.title for s in rep.sections] == SECTIONS
    html = rep.render()
    for metric in METRICS:
        label = stats["metric_info"][metric]["label"]
        assert f'aria-label="{label} ({metric})"' in html, metric  # one heatmap per metric
        assert f"<code>{metric}</code>" in html  # explained in the reading guide
    assert "L0 H1" in html and "previous token" in html  # the positional head
    assert "L2 H0 (0.81)" in html and "special tokens" in html  # the attention sink
    assert "tiny-bert &lt;test&gt;" in html and "synthetic &amp; random" in html
    assert "&lt;b&gt;bold&lt;/b&gt; &amp; risky" in html and "<b>bold" not in html
    maps = html[html.index('id="attention-maps"'):]
    assert all(f"most confident in L{r} (Confidence no special" in maps for r in range(3))
    assert "among the 3 most important (Importance ablation" in maps
    n_heat = html.count('class="hw-fig hw-heatmap"')
    # metrics + 2 similarity maps per layer + attention maps (>= one per layer per sentence)
    assert n_heat >= len(METRICS) + 2 * 3 + 2 * 3
    assert html.count('class="hw-fig hw-bars"') == 2 and html.count('class="hw-fig hw-hist"') == 4


def test_analysis_report_handles_ragged_and_minimal_stats(tmp_path):
    stats = make_stats(ragged=True)
    stats["heads"]["entropy"][0][2] = None  # a head without data (NaN written as null)
    stats["histogram"]["counts"][0][2] = [None] * 100
    stats["model"] = "/home/me/checkpoints/run-7/model"
    rep = analysis_report(stats)
    html = rep.render()
    assert "L1, H3: no head here" in html and "L0, H2: n/a" in html
    assert rep.title == "Attention heads of run-7/model" and "/home/me/checkpoints/run-7/model" in html
    assert "L0: 3 heads" in html  # the histogram skipped the head without data
    minimal = {k: stats[k] for k in ("headwise_stats", "model", "data", "sentences", "tokens", "sites")}
    minimal["heads"] = {"entropy": stats["heads"]["entropy"]}
    rep = analysis_report(minimal)
    assert [s.title for s in rep.sections] == ["Verdict", "How to read this page", "Per-head metrics",
                                               "Top and bottom heads", "Positional heads"]
    assert "No importance was measured" in rep.render()
    path = write_report(minimal, tmp_path)
    assert path == tmp_path / "report.html" and path.stat().st_size > 1000


@pytest.mark.parametrize("bad, match", [
    ({}, "headwise_stats"),
    ({"headwise_stats": 1, "sites": []}, "sites"),
    ({"headwise_stats": 1, "sites": [{"name": "a"}], "heads": {"x": [[1], [2]]}}, "2 rows for 1 sites"),
])
def test_bad_stats_are_refused(bad, match):
    with pytest.raises(HeadwiseError, match=match):
        analysis_report(bad)


@pytest.mark.browser
def test_report_opens_in_headless_chromium(tmp_path):
    path = write_report(make_stats(ragged=True), tmp_path)
    html = path.read_text(encoding="utf-8")
    page = browser.load(path)
    assert page.attribute("data-hw-ready") == "1", page.dom[:500]
    assert page.attribute("data-hw-errors") is None
    assert page.console == []
    assert page.count_class("hw-heatmap") == html.count('class="hw-fig hw-heatmap"') >= 13 + 6 + 6
    assert page.count_class("hw-hist") == 4 and page.count_class("hw-bars") == 2
    png = browser.screenshot(path, tmp_path / "screenshot.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


@pytest.mark.browser
def test_browser_reports_script_errors(tmp_path):
    page_path = tmp_path / "broken.html"
    rep = Report("broken")
    rep.add_section("s").text("<script>undefinedFunction()</script>", raw_html=True)
    page_path.write_text(rep.render(), encoding="utf-8")
    page = browser.load(page_path)
    assert page.attribute("data-hw-ready") == "1"
    assert "undefinedFunction" in (page.attribute("data-hw-errors") or "")


def test_analysis_report_opens_with_a_verdict_naming_the_removable_heads():
    stats = make_stats(layers=3, heads=4)
    table = [[1.0, 0.9, 0.8, 0.7], [0.05, 1.1, 0.95, 0.85], [0.9, 0.1, 1.2, 0.01]]  # median 0.875
    stats["heads"] = {"importance_gradient": table}
    stats["metric_info"] = {}
    stats["task"] = "stsb"
    rep = analysis_report(stats)
    assert rep.sections[0].title == "Verdict"
    html = rep.sections[0].render()
    # below a quarter of the median (0.219): L2 H3 (0.01), L1 H0 (0.05), L2 H1 (0.1), least important first
    assert "3 of 12 heads look removable" in html and "L2 H3, L1 H0, L2 H1" in html
    # quoted for the shell, so that it runs as printed (cli.suggest)
    assert "headwise plan --model &#x27;tiny-bert &lt;test&gt;&#x27; --task stsb --budget heads=9" in html
    stats["heads"] = {"importance_gradient": [[1.0] * 4] * 3}
    assert "No head stands out" in analysis_report(stats).sections[0].render()
