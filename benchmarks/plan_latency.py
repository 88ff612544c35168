"""The MiniLM plan's contenders at a latency budget, timed side by side with several copies of each.

``experiments/plan_minilm.py`` times every point of the plan one copy each; on a shared 2-core CPU two copies of
the *same* edit differ by a few percent (where their weights land in memory), which is as large as the gaps near
a 0.75x budget. This benchmark times ``--copies`` deep copies of each named point in the same rounds
(``headwise.planning.costs.measure_latencies``: base, every copy in a rotating order, base again); a run's
latency of a point is the median over its copies of each copy's median ratio to the unedited model, and
``--runs`` runs with fresh copies give the median and range reported.
Points are plan point names, or ``PRUNE+dk-F`` for a pair the plan did not measure (scored here on the plan's
dev subsample).

    python benchmarks/plan_latency.py --points prune-18,prune-27,prune-27+dk-0.25,prune-27+dk-0.125
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path

import torch
from common import machine, update_section

import headwise
from headwise.planning import Plan
from headwise.planning.costs import measure_latencies, static_costs
from headwise.collaborative import CollaborativeConfig
from headwise.planning.edits import Edit, apply_edit

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "experiments" / "results" / "plan_minilm.json"
OUT = Path(__file__).with_name("results") / "plan_latency_minilm.json"


def edit_for(plan: Plan, name: str) -> tuple[Edit, float | None]:
    """The edit of a plan point (and its measured score), or of ``PRUNE+dk-F`` built from the plan's pruning."""
    points = {p.name: p for p in plan.points}
    if name in points:
        return points[name].edit, points[name].measured["score"]
    prune, _, dk = name.partition("+dk-")
    if prune not in points or not dk:
        raise SystemExit(f"{name!r} is neither a point of the plan nor PRUNE+dk-F with PRUNE one of its points")
    return points[prune].edit.then(Edit((CollaborativeConfig(dk=float(dk)),))), None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", type=Path, default=PLAN)
    parser.add_argument("--points", default="prune-18,prune-27,prune-27+dk-0.25,prune-27+dk-0.125,prune-36+dk-0.25")
    parser.add_argument("--copies", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--runs", type=int, default=3, help="measurements, each with fresh copies")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    plan = Plan.from_dict(json.loads(args.plan.read_text())["plan"])
    model, tokenizer = headwise.load_model()
    model.eval()
    task = plan.make_task()
    calibration = task.calibration_inputs(tokenizer, limit=plan.settings["calibration"],
                                          batch_size=min(16, plan.settings["calibration"]))
    size = plan.settings["timing_batch"][0]
    timing = task.calibration_inputs(tokenizer, limit=size, batch_size=size)[0]
    names = [n.strip() for n in args.points.split(",") if n.strip()]
    rows, edited = {}, {}
    base_costs = static_costs(model, plan.settings["sequence_length"])
    for name in names:
        edit, score = edit_for(plan, name)
        edited[name] = apply_edit(copy.deepcopy(model), edit, calibration if edit.needs_calibration() else None)
        if score is None:
            score = float(task.evaluate(edited[name], tokenizer, progress=False)[task.metric])
        costs = static_costs(edited[name], plan.settings["sequence_length"])
        rows[name] = {"edit": edit.describe(), "score": round(score, 2),
                      "flops": round(costs.flops / base_costs.flops, 3), "runs": []}
    base_times = []
    for _ in range(args.runs):  # fresh copies each run: where the weights land in memory changes too
        copies = {f"{name}#{c}": copy.deepcopy(edited[name]) for name in names for c in range(args.copies)}
        measured, base_ms = measure_latencies(copies, model, timing, args.repeats)
        base_times.append(base_ms)
        for name in names:
            rows[name]["runs"].append(round(statistics.median(measured[f"{name}#{c}"][0]
                                                              for c in range(args.copies)), 3))
        del copies
    for row in rows.values():
        row.update(latency=statistics.median(row["runs"]), low=min(row["runs"]), high=max(row["runs"]))
    base_ms = statistics.median(base_times)
    result = {"command": " ".join(["python", *sys.argv]), "machine": machine(), "copies": args.copies,
              "repeats": args.repeats, "runs": args.runs, "timing_batch": list(timing["input_ids"].shape),
              "base_ms": round(base_ms, 1), "evaluated_on": plan.settings["evaluated_on"], "points": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    lines = [
        "## Plan contenders at a latency budget (MiniLM / STS-B)",
        "",
        f"Points of [experiments/results/plan_minilm.json](../experiments/results/plan_minilm.json) (or pairs built "
        f"from its pruning), {args.copies} copies each, timed side by side in {args.repeats} rounds (base, every "
        f"copy in a rotating order, base again) on a batch of {size} STS-B train sentences "
        f"({result['timing_batch'][1]} tokens); a run's latency is the median over copies of each copy's median "
        f"ratio to the unedited model ({base_ms:.0f} ms); {args.runs} runs with fresh copies, their median and "
        f"range in brackets. Spearman on the "
        f"{plan.settings['evaluated_on']}. Machine: {machine()}. Reproduce: `python benchmarks/plan_latency.py`.",
        "",
        "| point | edit | Spearman | attention FLOPs × | latency × [runs] |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {n} | {r['edit']} | {r['score']:.2f} | {r['flops']:.2f} | {r['latency']:.3f} "
              f"[{r['low']:.3f}–{r['high']:.3f}] |" for n, r in rows.items()]
    update_section("plan-latency", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
