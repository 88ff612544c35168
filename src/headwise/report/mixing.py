"""The mixing section: alpha matrices as heatmaps, their nuclear norms, head distances before/after mixing,
and a comparison of training arms (e.g. baseline vs. mixing vs. swaps)."""

from __future__ import annotations

from . import svg
from .builder import Report


def add_mixing_section(report: Report, result: dict) -> None:
    """``result``: ``{"alphas": headwise.mixing.alpha_table(model), "nuclear_before": {site: float} (optional),
    "distances": headwise.mixing.head_distances(...) (optional), "arms": {name: {metric: value}} (optional),
    "title": str (optional)}``."""
    alphas = result["alphas"]
    section = report.add_section(
        result.get("title", "Head mixing"),
        "Each attention site mixes its per-head outputs with an H × H matrix α before the output projection "
        "(`Z'_i = Σ_j α_ij Z_j`, identity = no mixing). Rows are output heads i, columns input heads j.",
    )
    if result.get("arms"):
        names = list(dict.fromkeys(k for arm in result["arms"].values() for k in arm))
        section.table([[arm, *(values.get(k) for k in names)] for arm, values in result["arms"].items()],
                      ["run", *names], caption="Training runs")
    span = max((abs(v - (i == j)) for a in alphas.values() for i, row in enumerate(a["alpha"])
                for j, v in enumerate(row)), default=1.0) or 1.0
    section.grid([(svg.heatmap(a["alpha"], [str(i) for i in range(len(a["alpha"]))],
                               [str(j) for j in range(len(a["alpha"]))], f"α {name}", vmin=-span, vmax=1 + span,
                               cmap="diverging", xlabel="input head j", ylabel="output head i", annotate=False),
                   f"‖α‖_* = {a['nuclear_norm']:.3f}") for name, a in alphas.items()])
    before = result.get("nuclear_before") or {}
    section.table([[name, a["kind"], before.get(name), a["nuclear_norm"]] for name, a in alphas.items()],
                  ["site", "kind", "‖α‖_* before", "‖α‖_* after"], caption="Nuclear norms (identity: H)")
    distances = result.get("distances")
    if distances:
        rows = []
        for name, d in distances["sites"].items():
            rows.append([name, *(d[when]["summary"][m]["mean_off_diagonal"]
                                 for m in ("cosine", "l2") for when in ("before", "after"))])
        section.table(rows, ["site", "cos before", "cos after", "L2 before", "L2 after"],
                      caption=f"Mean head-to-head cosine / L2 of per-head outputs over {distances['sentences']} "
                              "sentences, entering (before) and leaving (after) the mixer")
