"""Does a fact-lookup probe in kv_policy's calibration keep the long-context suite's QA at half the bytes? (issue 49)

At 0.5 of the KV bytes the policy keeps retrieval (38.3 vs 32.9 for the full cache on the reported seed 4949) but
not QA (29.5 vs 39.3), and its passkey calibration only asks for a number beside a marker no other sentence has.
This script tried a probe shaped like a question about one fact among several (``kvcache.lookup``): ``The red lamp
is kept in the attic.``, four such facts spread through the filler haystack, ``Where is the red lamp kept?``; the
``lookup`` score of a head is its attention mass on the asked room while the model says it, as ``retrieval`` is on
the passkey. Its words and wording are none of the suite's (names, jobs, cities).

Arms at 0.5 × 2,048 tokens on SmolLM2-135M, every other setting kv_policy's default: the full cache; ranked by
``retrieval`` (the default until this script), by ``lookup``, and by ``retrieval+lookup`` (each over its largest
head; the default since, ``kvcache.choose.DEFAULT_RANKING``). Judged on the
suite's samples of **seed 1234** (held out: the reported comparison draws 4949), QA weighted up. Every sample goes to
``RESULTS/kv_lookup_probe.samples.jsonl`` (resumable); the summary to ``RESULTS/kv_lookup_probe.json``.

  python experiments/kv_lookup_probe.py
"""

from __future__ import annotations

import argparse
import sys

import common
import headwise
from headwise.kvcache import PolicyCache, ScoreConfig, head_scores, kv_policy
from headwise.tasks.long import LongContext, paired_difference, summarize

SEED = 1234  # held out: the reported suite draws seed 4949
CONTEXT, BUDGET = 2048, 0.5
SAMPLES = {"niah_single": 12, "niah_multi": 8, "vt": 4, "cwe": 4, "fwe": 8, "qa": 24}
RANKINGS = ("retrieval", "lookup", "retrieval+lookup")


def main() -> None:
    from transformers.cache_utils import DynamicCache

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    args = p.parse_args()
    model, tokenizer = headwise.load_model(args.model, task="lm")
    headwise.enable(model)
    model.eval()
    scores = head_scores(model, tokenizer, ScoreConfig(), progress=False)
    policies = {name: kv_policy(model, tokenizer, kv_budget=BUDGET, context=CONTEXT, ranking=name, scores=scores,
                                progress=False)[0] for name in RANKINGS}
    top = {name: set(policy.full_heads()) for name, policy in policies.items()}
    task = LongContext(lengths=str(CONTEXT), samples=SAMPLES, seed=SEED)
    log = task.log(common.RESULTS / "kv_lookup_probe.samples.jsonl", model, f"{args.model} (float32)")
    records = {"full": task.run(model, tokenizer, log=log, arm="full", progress=True,
                                make_cache=lambda m, n: DynamicCache(config=m.config))}
    for name, policy in policies.items():
        records[f"{name}@{BUDGET:g}"] = task.run(model, tokenizer, log=log, arm=f"{name}@{BUDGET:g}", progress=True,
                                                 make_cache=lambda m, n, p=policy: PolicyCache(p, length=n))
    out = {"what": __doc__.split("\n\n")[0], "model": args.model, "seed": SEED, "context": CONTEXT, "budget": BUDGET,
           "samples": SAMPLES, "full_heads_shared_with_retrieval": {n: len(top[n] & top["retrieval"]) for n in top},
           "arms": {}}
    for arm, recs in records.items():
        s = summarize(recs)
        row = {"score": s["score"], "ci": s["score_ci"], "families": s["families"], "tasks": s["tasks"]}
        if arm != "full":
            d = paired_difference(recs, records["full"])
            row["minus_full"], row["minus_full_ci"] = d["difference"], d["ci"]
        out["arms"][arm] = row
        print(arm, f"{s['score']:.1f}", {k: round(v, 1) for k, v in s["tasks"].items()},
              "" if arm == "full" else f"− full {row['minus_full']:+.1f}", file=sys.stderr, flush=True)
    pairs = [(f"{a}@{BUDGET:g}", f"retrieval@{BUDGET:g}") for a in RANKINGS if a != "retrieval"]
    out["differences"] = {f"{a} - {b}": paired_difference(records[a], records[b]) for a, b in pairs}
    common.save_results(common.RESULTS / "kv_lookup_probe.json", out)


if __name__ == "__main__":
    main()
