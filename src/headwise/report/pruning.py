"""The pruning section: metric vs. heads kept, and which heads survived (a site × head grid)."""

from __future__ import annotations

from . import svg
from .builder import Report


def add_pruning_section(report: Report, result: dict) -> None:
    """``result`` is the ``pruning.json`` written by ``headwise prune`` (see ``headwise.cli.prune``)."""
    section = report.add_section(
        "Pruning",
        f"Method **{result['method']}**: {result['heads_before']} → {result['heads_after']} heads. "
        "Removed heads are physically cut from the q/k/v and output projections; the saved model reloads with "
        "`headwise.from_pretrained`.",
    )
    recovery = result.get("recovery") or {"mode": "none"}
    if recovery["mode"] != "none":
        distill = recovery["mode"] == "distill"
        teacher = f", distilled from {recovery['teacher']} (α {recovery['alpha']:g})" if distill else ""
        section.text(f"Recovery: **{recovery['mode']}** for {recovery['epochs']:g} epoch(s) on the task{teacher}.")
    points = [p for p in result.get("curve", []) if p[1] is not None]
    metric = result.get("metric_name", "metric")
    if points:
        series = {"masked": ([p[0] for p in points], [p[1] for p in points])}
        if result.get("metric_before") is not None:
            series["all heads"] = ([points[-1][0], result["heads_before"]], [result["metric_before"]] * 2)
        final = result["metric_recovered"] if result.get("metric_recovered") is not None else result.get("metric_edited")
        if final is not None:
            series["final model"] = ([result["heads_after"]], [final])
        section.figure(svg.lines(series, "heads kept", metric, f"{metric} vs. heads kept"),
                       "Each step masks more heads; the final point is the pruned (and, for L0, trained) model.")
    survivors = result["survivors"]
    width = max(len(row) for row in survivors.values())
    section.figure(
        svg.heatmap([row for row in survivors.values()], list(survivors), [str(h) for h in range(width)],
                    "heads kept (1) and removed (0)", vmin=0, vmax=1, cmap="viridis", xlabel="head", annotate=False,
                    ylabel="site", legend="kept"),
        "Rows are attention sites (kind.layer); heads are numbered as in the original model.",
    )
    rows = [["heads", result["heads_before"], result["heads_after"]],
            ["parameters", result["costs"]["before"]["parameters"], result["costs"]["after"]["parameters"]]]
    if result.get("metric_before") is not None:
        rows.append([f"{metric} after pruning", result["metric_before"], result.get("metric_edited")])
        if result.get("metric_recovered") is not None:
            rows.append([f"{metric} after recovery", result["metric_before"], result["metric_recovered"]])
    section.table(rows, ["", "before", "after"])
