"""The quantization report: trade-off curves and tables of a sweep (``results.json`` of ``headwise quantize``).

``write_quantization_report(results, out_dir)`` writes ``out_dir/report.html``; ``quantization_report(results)``
returns the :class:`~headwise.report.builder.Report` for callers that add sections.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from . import svg
from .builder import Report

PRUNING = "threshold pruning"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def _num(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _flat(name: str, xs: list[float], y: float) -> dict[str, tuple[list[float], list[float]]]:
    return {name: ([min(xs), max(xs)], [y, y])} if xs else {}


def quantization_report(results: dict[str, Any]) -> Report:
    """The report of a sweep (``SweepResult.to_dict()``)."""
    rows, baseline, tol = results["rows"], results["baseline"], results["tolerance"]
    floor = baseline - tol * abs(baseline)
    metric = results.get("metric_name") or "metric"
    report = Report("headwise attention quantization", subtitle="SPIQA pruning and quantization of attention "
                    "probabilities: accuracy against bits and against the share of attention values set to 0.",
                    meta={"model": results.get("model", ""), "metric": metric, "baseline": f"{baseline:.2f}",
                          "tolerance": f"{100 * tol:g}% relative", "settings": len(rows)},
                    footer="Fake quantization: values are quantized, storage and kernels stay float32.")
    flat_colors = {"baseline": "#000000", f"-{100 * tol:g}%": "#999999"}

    quant = [r for r in rows if r["bits"] is not None]
    by_method: dict[str, list[dict]] = {}
    for r in sorted(quant, key=lambda r: r["bits"]):
        by_method.setdefault(r["method"], []).append(r)
    bits = sorted({r["bits"] for r in quant})
    summary = report.add_section("Summary", intro=(
        f"For each method: the fewest bits whose {metric} stays within {100 * tol:g}% (relative) of the unmodified "
        f"model ({baseline:.2f}, i.e. at least {floor:.2f}), and the largest measured share of attention values that "
        "are exactly 0 among the settings within that tolerance. Sparsity counts real tokens only (padding "
        "excluded)."))
    summary.table([[s["method"], s["fewest_bits"] if s["fewest_bits"] is not None else "—",
                    _num(s["metric_at_fewest_bits"]), _pct(s["max_sparsity"]), s["max_sparsity_setting"] or "—",
                    _num(s["metric_at_max_sparsity"]), f"{s['within']}/{s['settings']}"]
                   for s in results["summary"]],
                  header=["method", "fewest bits within", "metric there", "max share pruned within", "at",
                          "metric there", "settings within"])

    if by_method:
        sec = report.add_section("Metric against bits", intro=(
            "One curve per quantizer (binarization and pruning-only settings have no bit width). Log-scale "
            "quantizers keep small attention values apart, which linear ones merge into 0."))
        series = {m: ([r["bits"] for r in rs], [r["metric"] for r in rs]) for m, rs in by_method.items()}
        series.update(_flat("baseline", bits, baseline))
        series.update(_flat(f"-{100 * tol:g}%", bits, floor))
        sec.figure(svg.lines(series, "bits", metric, f"{metric} against bits", colors=flat_colors, width=760,
                             height=380), "All settings.")
        sec.figure(svg.lines(series, "bits", metric, "the same, near the baseline", colors=flat_colors, width=760,
                             height=380, ylim=(floor - 2 * tol * abs(baseline), baseline + 0.5 * tol * abs(baseline))),
                   "Zoomed to the tolerance band; lines leaving the frame fall below it.")
        distinct = {m: ([r["bits"] for r in rs], [r["distinct"] for r in rs]) for m, rs in by_method.items()}
        distinct["2^bits"] = (bits, [2.0 ** b for b in bits])
        sec.figure(svg.lines(distinct, "bits", "distinct values", "distinct values in one layer's output",
                             logy=True, colors={"2^bits": "#999999"}, width=760, height=380),
                   "Most distinct values (0 included) one layer produced in one batch; the grey line is 2^bits.")

    pruned = sorted([r for r in rows if r["method"] == "none"], key=lambda r: r["sparsity"])
    sec = report.add_section("Metric against the share pruned", intro=(
        "Threshold pruning alone (values ≤ t set to 0, rows not renormalised unless asked) as a curve, and "
        "every quantizer setting as points: x is the measured share of attention values that are exactly 0."))
    series = {PRUNING: ([r["sparsity"] for r in pruned], [r["metric"] for r in pruned])} if pruned else {}
    for r in rows:  # every quantizer setting, binarization included, in order of bits
        if r["method"] != "none":
            xs_m, ys_m = series.setdefault(r["method"], ([], []))
            xs_m.append(r["sparsity"])
            ys_m.append(r["metric"])
    xs = [x for s in series.values() for x in s[0]]
    series.update(_flat("baseline", xs, baseline))
    series.update(_flat(f"-{100 * tol:g}%", xs, floor))
    sec.figure(svg.lines(series, "share of attention values = 0", metric, f"{metric} against the share pruned",
                         colors={**flat_colors, PRUNING: "#000000", "baseline": "#555555"}, width=760, height=380,
                         ylim=(floor - 2 * tol * abs(baseline), baseline + 0.5 * tol * abs(baseline))),
               "Zoomed to the tolerance band; points below it leave the frame (see the table).")
    ok = [r for r in pruned if r["within"]]
    if ok:
        best = max(ok, key=lambda r: r["sparsity"])
        sites = results["sites"]
        table = [h if h is not None else [] for h in best["per_head"]]
        sec.figure(svg.heatmap(table, sites, [f"H{h}" for h in range(max(len(r) for r in table))],
                               f"share pruned per head, {best['label']}", 0.0, 1.0, xlabel="head", ylabel="site",
                               legend="share = 0"),
                   f"The most pruning within tolerance ({_pct(best['sparsity'])} overall, metric "
                   f"{best['metric']:.2f}).")

    every = report.add_section("Every setting")
    every.table([[r["label"], r["bits"] if r["bits"] is not None else "—", r["threshold"], _num(r["metric"]),
                  _num(None if r["drop"] is None else 100 * r["drop"]), "yes" if r["within"] else "no", _pct(r["sparsity"]), r["distinct"],
                  r["distinct_union"] if r["distinct_union"] is not None else "> 131072", _num(r["seconds"], 1)]
                 for r in rows],
                header=["setting", "bits", "threshold", metric, "drop %", "within", "share = 0",
                        "distinct (one layer)", "distinct (all measured)", "seconds"])
    return report


def write_quantization_report(results: dict[str, Any], out_dir: str | os.PathLike, overwrite: bool = False) -> Path:
    """Write ``out_dir/report.html`` for a sweep's results and return its path."""
    return quantization_report(results).write(out_dir, overwrite=overwrite)
