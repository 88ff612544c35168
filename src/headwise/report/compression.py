"""The compression section of an HTML report: error and parameters versus ``D~k``, and per-site numbers."""

from __future__ import annotations

from .builder import Report
from .svg import lines


def add_compression_section(report: Report, summary: dict) -> None:
    """``summary`` is what ``headwise compress`` writes to compression.json."""
    objective = "attention scores on the calibration set" if summary["objective"] == "scores" else "weights"
    section = report.add_section(
        "Collaborative heads",
        f"Every head's `W_q^hᵀ W_k^h` was decomposed into one shared query/key space of width dk={summary['dk']} "
        f"(objective: {objective}). Relative errors are ‖T − T̂‖ / ‖T‖ over the stacked per-head products.",
    )
    metrics = [("STS-B dev before", summary["metric_before"]), ("after compression", summary["metric_edited"]),
               (f"after {(summary.get('recovery') or {}).get('mode', 'no')} recovery", summary["metric_recovered"])]
    rows = [("query/key parameters", f"{summary['params_before']:,}", f"{summary['params_after']:,}"),
            ("model parameters", f"{summary['costs']['before']['parameters']:,}",
             f"{summary['costs']['after']['parameters']:,}")]
    section.table(rows, ["", "before", "after"])
    if summary["metric_before"] is not None:
        section.table([(name, value) for name, value in metrics if value is not None], ["", summary["metric_name"]])
    curve = summary["curve"]
    if curve:
        dks = [c["dk"] for c in curve]
        axis = "dk (share of each site's heads × head_dim)" if isinstance(dks[0], float) else "dk"
        mean = lambda c, key: sum(s[key] for s in c["sites"]) / len(c["sites"])  # noqa: E731
        errors = {"weight error": (dks, [mean(c, "weight_error") for c in curve])}
        if summary["objective"] == "scores":
            errors["score error (calibration)"] = (dks, [mean(c, "score_error") for c in curve])
        section.grid([
            (lines(errors, axis, "mean relative error", "Reconstruction error vs. dk"),
             "Mean over sites; the exact form (dk = heads × head_dim) has error 0."),
            (lines({"collaborative": (dks, [c["params_after"] for c in curve]),
                    "original": (dks, [summary["params_before"]] * len(dks))},
                   axis, "query/key parameters", "Parameters vs. dk"), None),
        ])
    section.table(
        [(s["name"], s["dk"], s["weight_error"], s["score_error"] if s["score_error"] is not None else "–",
          s["params_before"], s["params_after"], round(s["seconds"], 3)) for s in summary["sites"]],
        ["site", "dk", "weight error", "score error", "q/k params before", "after", "seconds"],
        caption="Per site",
    )
