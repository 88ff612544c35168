"""``headwise plan`` on SmolLM2-135M / WikiText-2: fronts of perplexity vs. attention parameters and vs. KV-cache
bytes per token, each single method beside the combined plans.

Methods: key/value groups removed (ranked by gradient importance of the next-token loss; whole groups, so the
removal is physical and shrinks the cache), key/value heads merged (``convert_gqa``, 3 → 1, calibrated),
attention-probability quantization and thresholding, a local window on the layers it disturbs least, and the
pairs (groups removed × KV merge or window). Perplexity on the first ``--max-tokens`` tokens of the eval part of
``shared/data/wikitext-2/valid.txt`` in ``--max-length``-token windows; no recovery.

    python experiments/plan_smollm2.py                 # writes experiments/results/plan_smollm2.json
    python experiments/plan_smollm2.py --timing-only   # re-time every point (scores kept), rewrite the file

Sizes are cut for a shared CPU (each job should stay under 10 minutes): see ``--help``.
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

OUT = common.RESULTS / "plan_smollm2.json"
AXES = ("attention_params", "kv_bytes")


def fronts(plan: Plan) -> dict:
    """Per axis: each single method's points and the combined ones as (cost ratio, perplexity), sorted."""
    base = plan.base.measured
    out = {}
    for axis in AXES:
        series: dict[str, list] = {}
        for p in plan.points:
            key = "base" if p.kind == "base" else "combined" if p.kind == "combined" else p.methods[0]
            series.setdefault(key, []).append([round(p.measured[axis] / base[axis], 4),
                                               round(p.measured["score"], 3), p.name])
        out[axis] = {k: sorted(v) for k, v in series.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="kv-cache=-50%")
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--examples", type=int, default=16, help="train windows for gradient importance")
    parser.add_argument("--calibration", type=int, default=8, help="calibration windows (KV merge, proxies)")
    parser.add_argument("--methods", default="prune_heads,gqa,collaborative,replace,quantization")
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--timing-only", action="store_true")
    parser.add_argument("--out", default=str(OUT))
    common.add_data(parser, common.WIKITEXT, "the lm task's text file")
    common.add_device(parser)
    args = parser.parse_args()
    torch.manual_seed(0)
    data = common.load_results(args.out) if args.timing_only else {}
    if args.timing_only and "plan" not in data:
        raise SystemExit(f"--timing-only re-times the plan in --out, and {args.out} holds none")
    plan = Plan.from_dict(data["plan"]) if args.timing_only else None
    task = plan.make_task() if plan else get_task("lm", max_length=args.max_length, max_tokens=args.max_tokens,
                                                  data=None if args.data is None else str(args.data))
    model, tokenizer = headwise.load_model("smollm2-135m", task=task, device=args.device)
    start = time.time()
    if plan is not None:  # the plan's own task: same windows, same calibration
        plan.retime(model, tokenizer, repeats=args.repeats, task=task, progress=True)
        data["timing"] = {"retimed": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "repeats": args.repeats}
    else:
        plan = headwise.plan(model, tokenizer, task, args.budget, examples=args.examples,
                             calibration=args.calibration, top_k=args.top_k, repeats=args.repeats,
                             methods=tuple(args.methods.split(",")), model_name="smollm2-135m", progress=True)
        data.update({"command": " ".join(["python", *sys.argv]),
                     "timing": {"retimed": None, "repeats": args.repeats},
                     "machine_note": "latency measured while other jobs shared the CPU unless 'retimed' says so"})
    data.update({"seconds": round(time.time() - start, 1), "fronts": fronts(plan), "recommended": plan.recommended,
                 "plan": plan.to_dict()})
    common.save_results(args.out, data)
    print(json.dumps({"recommended": plan.recommended, "fronts": data["fronts"]}, indent=1))


if __name__ == "__main__":
    main()
