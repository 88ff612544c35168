"""The plan report: the verdict first (recommended edit, its score, what it saves, the command that applies it),
then the Pareto fronts (score vs. each cost axis, each single method's curve beside the combined front), every
measured point, and the per-layer choices."""

from __future__ import annotations

from typing import Any

from ..contract import METHODS, config_from_dict, method_of
from ..planning import Budget
from ..planning.axes import COSTS, cost_ratio, savings
from ..planning.pareto import front
from . import svg
from .builder import Report


def _ratio(point: dict, base: dict, key: str) -> float | None:
    return cost_ratio(point["measured"], base["measured"], key)


def verdict(plan: dict[str, Any], path: str = "plan.json") -> str:
    """One paragraph: what to do, what it scores and saves, the command."""
    points = {p["name"]: p for p in plan["points"]}
    base = points["base"]
    metric = plan["task"]["metric"]
    rec = points.get(plan["recommended"]) if plan["recommended"] else None
    budget = str(Budget.parse(plan["budget"]))
    if rec is None:
        sign = 1 if plan["task"]["higher_is_better"] else -1
        best = max((p for p in plan["points"] if p["kind"] != "base"), default=None,
                   key=lambda p: sign * p["measured"]["score"])
        return (f"**No measured edit meets the budget {budget}.** The unedited model scores {metric} "
                f"{base['measured']['score']:.2f}. Loosen the budget, or look at the front below"
                + (f" (e.g. `{best['name']}`: {metric} {best['measured']['score']:.2f}, {savings(best, base)})."
                   if best else "."))
    return (f"**Recommended: {rec['describe']}** (`{rec['name']}`): {metric} {rec['measured']['score']:.2f} "
            f"(unedited {base['measured']['score']:.2f}), {savings(rec, base)}; meets the budget {budget}. "
            f"Apply it with `{plan['command'].replace('plan.json', path)}`.")


def add_plan_sections(report: Report, plan: dict[str, Any]) -> None:
    """``plan`` is the ``plan.json`` dict written by ``headwise plan`` (``Plan.to_dict``)."""
    report.add_section("Verdict", verdict(plan))
    points = plan["points"]
    base = next(p for p in points if p["kind"] == "base")
    metric = plan["task"]["metric"]
    settings = plan["settings"]
    fronts = report.add_section(
        "Pareto fronts",
        f"Every point is **measured**: {metric} on {settings['evaluated_on']}, costs counted on the edited model "
        f"after physical removal, latency timed beside the unedited model on a batch of shape "
        f"{settings['timing_batch']} ({settings['latency_repeats']} alternating repeats, median) on "
        f"{settings['device']}. Lines: each single method at its levels; the combined front joins the "
        "non-dominated points of every kind.")
    figures = []
    for axis in COSTS:
        key = axis.key
        if not any(p["measured"].get(key) for p in points) or (key == "kv_bytes" and not base["measured"][key]):
            continue
        series = _series([p for p in points if p["measured"].get(key) is not None], key,
                         plan["task"]["higher_is_better"])
        figures.append((svg.lines(series, axis.label, metric, f"{metric} vs. {axis.label}"), None))
    fronts.grid(figures)
    table = report.add_section("Measured points", "Predicted values (combined plans only) come from the measured "
                                                  "single methods: score changes added, cost ratios multiplied.")
    rows = []
    for p in points:
        m, pred = p["measured"], p.get("predicted") or {}
        ratios = ["" if axis.key == "kv_bytes" and not base["measured"]["kv_bytes"] else
                  "not counted" if m.get(axis.key) is None else f"{_ratio(p, base, axis.key):.2f}" for axis in COSTS]
        rows.append([p["name"], p["kind"], p["describe"], f"{m['score']:.2f}",
                     "" if pred.get("score") is None else f"{pred['score']:.2f}", m["heads"], *ratios,
                     "" if p.get("proxy") is None else f"{p['proxy']:.3g}",
                     "yes" if p["meets_budget"] else "", "yes" if p["on_front"] else ""])
    table.table(rows, ["point", "kind", "edit", metric, "predicted", "heads", *(axis.short for axis in COSTS),
                       "output error", "in budget", "front"])
    uncounted = {p["name"]: p["measured"]["uncounted"] for p in points if p["measured"].get("uncounted")}
    if uncounted:
        table.text("FLOPs not counted (never costed as softmax attention): " + "; ".join(
            f"`{name}`: {' '.join(why)}" for name, why in uncounted.items()))
    layers = report.add_section("Per layer", "Head importance (the ranking that orders removals), what the "
                                             "recommended plan does at each layer, and the per-layer proxies the "
                                             "methods measured to choose their levels.")
    rec = next((p for p in points if p["name"] == plan["recommended"]), None)
    configs = [config_from_dict(r) for r in rec["edit"]] if rec else []
    labels = sorted({label for layer in plan["layers"].values() for label in layer.get("proxies", {})})
    rows = []
    for name, layer in plan["layers"].items():
        here = [method_of(c).at_site(c, name) for c in configs if method_of(c).at_site]
        proxies = layer.get("proxies", {})
        rows.append([name, layer["heads"], layer["kv_heads"], "; ".join(h for h in here if h) or "—",
                     " ".join(f"{x:.2f}" for x in (layer["importance"] or [])),
                     *("" if proxies.get(label) is None else f"{proxies[label]:.3g}" for label in labels)])
    layers.table(rows, ["layer", "heads", "KV heads", "recommended edit here", "importance per head", *labels])
    if plan.get("skipped"):
        report.add_section("Not tried", "\n".join(f"- **{k}**: {v}" for k, v in plan["skipped"].items()))


def _series(points: list[dict], key: str, higher_is_better: bool) -> dict[str, tuple[list[float], list[float]]]:
    groups: dict[str, list[dict]] = {}
    base = next(p for p in points if p["kind"] == "base")
    for p in points:
        if p["kind"] == "single":
            groups.setdefault(_label(p["methods"][0]), []).append(p)
    series = {}
    for method, ps in groups.items():
        ps = sorted(ps + [base], key=lambda p: p["measured"][key])
        series[method] = ([p["measured"][key] for p in ps], [p["measured"]["score"] for p in ps])
    combined = sorted((p for p in points if p["kind"] == "combined"), key=lambda p: p["measured"][key])
    if combined:
        series["combined"] = ([p["measured"][key] for p in combined], [p["measured"]["score"] for p in combined])
    sign = -1 if higher_is_better else 1
    on = sorted((points[i] for i in front([[p["measured"][key], sign * p["measured"]["score"]] for p in points])),
                key=lambda p: p["measured"][key])
    series["front (all measured)"] = ([p["measured"][key] for p in on], [p["measured"]["score"] for p in on])
    return series


def _label(method: str) -> str:
    """A method's name in plots: its declared label (``Planned.label``), else its registered name."""
    planned = METHODS[method].planned if method in METHODS else None
    return planned.label if planned and planned.label else method
