"""``headwise plan`` on MiniLM / STS-B at a 0.75× latency budget: does the combined plan beat the best single
method at the same measured latency?

Model: the packaged all-MiniLM-L6-v2 (no STS-B fine-tuning). Importance ranks heads by the STS-B train loss;
every single-method level and the best predicted combinations are measured on STS-B dev (``--limit`` pairs), costs
counted after physical removal, latency timed beside the unedited model on a batch of 64 train sentences.

    python experiments/plan_minilm.py                 # full run: writes experiments/results/plan_minilm.json
    python experiments/plan_minilm.py --timing-only   # re-time every point of that file (scores kept), rewrite it

Latency is only meaningful on an otherwise idle machine: run ``--timing-only`` there (it re-applies each edit and
re-measures; a few minutes on CPU).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

import common
import headwise
from headwise.planning import Plan
from headwise.tasks import get_task

OUT = common.RESULTS / "plan_minilm.json"


def verdict(plan: Plan, latency: float) -> dict:
    """Best single method and best combined plan at measured latency ≤ ``latency``, and the answer."""
    def best(kind: str):
        ok = [p for p in plan.points if p.kind == kind and p.measured["latency"] <= latency]
        return max(ok, key=lambda p: p.measured["score"], default=None)

    single, combined = best("single"), best("combined")
    row = lambda p: None if p is None else {"point": p.name, "edit": p.edit.describe(),  # noqa: E731
                                            "spearman": round(p.measured["score"], 2),
                                            "latency": round(p.measured["latency"], 3)}
    answer = (None if single is None or combined is None
              else combined.measured["score"] > single.measured["score"])
    return {"latency_budget": latency, "best_single": row(single), "best_combined": row(combined),
            "combined_beats_single": answer}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="latency=0.75x")
    parser.add_argument("--limit", type=int, default=500, help="STS-B dev pairs scored per point")
    parser.add_argument("--examples", type=int, default=256, help="train pairs for gradient importance")
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=9, help="latency repeats per point")
    parser.add_argument("--timing-only", action="store_true", help="re-time the points of the results file")
    parser.add_argument("--out", default=str(OUT))
    common.add_data(parser, "stsb", "the STS-B folder (the stsb task's data)")
    common.add_device(parser)
    args = parser.parse_args()
    torch.manual_seed(0)
    model, tokenizer = headwise.load_model(device=args.device)
    start = time.time()
    if args.timing_only:
        data = common.load_results(args.out)
        if "plan" not in data:
            raise SystemExit(f"--timing-only re-times the plan in --out, and {args.out} holds none")
        plan = Plan.from_dict(data["plan"])
        plan.retime(model, tokenizer, repeats=args.repeats, progress=True)
        timing = {"retimed": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "repeats": args.repeats}
    else:
        task = get_task("stsb", split="dev", limit=args.limit, data=None if args.data is None else str(args.data))
        plan = headwise.plan(model, tokenizer, task, args.budget, examples=args.examples, top_k=args.top_k,
                             repeats=args.repeats, model_name="all-MiniLM-L6-v2 (packaged)", progress=True)
        data, timing = {}, {"retimed": None, "repeats": args.repeats}
    budget = headwise.Budget.parse(plan.budget)
    data.update({"command": " ".join(["python", *sys.argv]),
                 "machine_note": "latency measured while other jobs shared the CPU unless 'retimed' says otherwise",
                 "timing": timing, "seconds": round(time.time() - start, 1),
                 "verdict": verdict(plan, budget.latency or 1.0), "plan": plan.to_dict()})
    common.save_results(args.out, data)
    print(json.dumps(data["verdict"], indent=1))


if __name__ == "__main__":
    main()
