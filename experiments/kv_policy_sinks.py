"""What vLLM cannot keep of a KV policy: the streaming heads' sink tokens (issue 69, docs/serving.md).

vLLM's sliding window keeps the last tokens of a head and frees the rest; it has no per-request "first tokens". So a
policy served by vLLM (``headwise.clients.vllm.export_vllm``) is the policy with sink 0 and the same window and full
heads. This script scores both in headwise, on the same long-context suite samples (``tasks.long``, its own seed
4949 and generated haystack: the samples ``headwise kv-policy`` checks with), at 2,048 tokens and the default
policy for half the KV bytes there (kv_policy's default ranking, calibration seed 0): with sinks (what headwise runs)
and without (what vLLM serves; at the policy's own length its scaled window is the fixed window vLLM gets), and the
paired difference with its 95% interval.

  python experiments/kv_policy_sinks.py --samples 4
"""

from __future__ import annotations

import argparse
import time

import common
import headwise
from headwise.kvcache import FULL, KVPolicy, PolicyCache, kv_policy, streaming
from headwise.tasks.long import VERIFY_TASKS, LongContext, paired_difference, summarize

CONTEXT = 2048
BUDGET = 0.5
RESULTS = common.RESULTS / "kv_policy_sinks.json"


def without_sinks(policy: KVPolicy) -> KVPolicy:
    """The same full heads and windows, every streaming head's sink 0: what vLLM serves."""
    return KVPolicy(tuple(tuple(FULL if rule.full else streaming(0, rule.window, rule.context) for rule in layer)
                          for layer in policy.heads))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=4, help="samples per task (niah_single, niah_multi, qa)")
    args = parser.parse_args()
    model, tokenizer = headwise.load_model("smollm2-135m", task="lm", dtype="float32")
    policy, _ = kv_policy(model, tokenizer, kv_budget=BUDGET, context=CONTEXT, progress=False)
    arms = {"with sinks (headwise)": policy, "without sinks (vLLM)": without_sinks(policy)}
    task = LongContext(None, (CONTEXT,), args.samples, tasks=VERIFY_TASKS)
    start = time.monotonic()
    records = {name: task.run(model, tokenizer, arm=name, make_cache=lambda m, n, p=p: PolicyCache(p, length=n),
                              progress=False) for name, p in arms.items()}
    names = list(arms)
    result = {"policy": policy.describe(), "length": CONTEXT, "kv_budget": BUDGET, "samples_per_task": args.samples,
              "drawn_from": task.spec().describe(),
              "arms": {name: summarize(r) for name, r in records.items()},
              "difference (without − with)": paired_difference(records[names[1]], records[names[0]]),
              "seconds": round(time.monotonic() - start)}
    common.save_results(RESULTS, result)
    for name in names:
        print(f"{name}: {result['arms'][name]['score']:.1f}")
    diff = result["difference (without − with)"]
    print(f"without − with: {diff['difference']:+.1f} (95% interval {diff['ci'][0]:+.1f} to {diff['ci'][1]:+.1f}, "
          f"{diff['samples']} samples)")


if __name__ == "__main__":
    main()
