"""What vLLM cannot keep of a KV policy: the streaming heads' sink tokens, and what a sink logit recovers (issue 69,
docs/serving.md).

vLLM's sliding window keeps the last tokens of a head and frees the rest; it has no per-request "first tokens", but
its attention takes a *sink logit* per query head (gpt-oss's attention sinks: a virtual key with a zero value in
the softmax). This script scores, in headwise, on the same long-context suite samples (``tasks.long``, its own seed
4949 and generated haystack: the samples ``headwise kv-policy`` checks with), at 2,048 tokens and the default
policy for half the KV bytes there (kv_policy's default ranking, calibration seed 0), three arms:

- **with sinks** (what headwise runs);
- **without sinks**: the same full heads and windows, sink 0 (what vLLM serves without sinks; at the policy's own
  length its scaled window is the fixed window vLLM gets);
- **sink logit**: without sinks, each streaming query head adding a constant logit to its softmax
  (``kvcache.sink_logit``), calibrated as the mean (``--median``: also the median, a fourth arm) over the queries
  of ``CALIBRATION`` passkey prompts (seed 0, not the suite's) of the log-sum-exp of ``scale·q·k`` over the sink
  tokens;

and the paired differences with their 95% intervals. The samples run interleaved (every arm on a sample before the
next sample) into a resumable log beside the results (``--resume``); ``--report`` writes the results of the
samples every arm has scored so far (a stopped run still pairs its samples).

  python experiments/kv_policy_sinks.py --samples 8          # then, stopped early: --report
"""

from __future__ import annotations

import argparse
import json

import torch

import common
import headwise
from headwise.kvcache import FULL, KVPolicy, PolicyCache, kv_policy, passkey_prompts, streaming
from headwise.kvcache.choose import default_window
from headwise.kvcache.sink_logit import sink_logit_cache, sink_logits
from headwise.tasks.long import VERIFY_TASKS, LongContext, ResultLog, paired_difference, run_sample, summarize
from headwise.tasks.long_data import draw

CONTEXT = 2048
BUDGET = 0.5
CALIBRATION = 4  # passkey prompts of CONTEXT tokens the sink logits are calibrated on
RESULTS = common.RESULTS / "kv_policy_sinks.json"
LOG = common.RESULTS / "kv_policy_sinks.jsonl"
WITH, WITHOUT = "with sinks (headwise)", "without sinks (vLLM today)"


def without_sinks(policy: KVPolicy) -> KVPolicy:
    """The same full heads and windows, every streaming head's sink 0: what vLLM serves."""
    return KVPolicy(tuple(tuple(FULL if rule.full else streaming(0, rule.window, rule.context) for rule in layer)
                          for layer in policy.heads))


def calibrated(model, tokenizer, sink: int, window: int, reductions: list[str]) -> dict[str, torch.Tensor]:
    """The sink logits ``[L, Hkv, g]`` of each reduction, on ``CALIBRATION`` passkey prompts (seed 0)."""
    depths = [(i + 0.5) / CALIBRATION for i in range(CALIBRATION)]
    prompts = [p.ids for p in passkey_prompts(tokenizer, CONTEXT, depths, 1, seed=0)]
    return {r: sink_logits(model, prompts, sink, window, reduce=r) for r in reductions}


def report(log: ResultLog, logits: dict[str, torch.Tensor], sink: int, window: int) -> None:
    """Write ``RESULTS`` from the samples every arm of ``log`` has scored (paired), and print the scores."""
    arms = list(dict.fromkeys(arm for arm, _ in log.records))
    common_keys = set.intersection(*({r["key"] for r in log.of(arm)} for arm in arms))
    records = {arm: [r for r in log.of(arm) if r["key"] in common_keys] for arm in arms}
    named = {r: v.flatten() for r, v in logits.items()}
    counts = {t: sum(1 for k in common_keys if k.startswith(f"{t}/")) for t in VERIFY_TASKS}
    result = {"policy": log.header["policy"], "length": CONTEXT, "kv_budget": BUDGET, "samples_per_task": counts,
              "paired_samples": len(common_keys), "drawn_from": log.header["drawn_from"],
              "sink_logits": {r: {"calibration": f"{CALIBRATION} passkey prompts of {CONTEXT} tokens, seed 0; "
                                  f"queries past sink {sink} + window {window}",
                                  "min": v.min().item(), "max": v.max().item(), "mean": v.mean().item()}
                              for r, v in named.items()},
              "arms": {name: summarize(r) for name, r in records.items()},
              "differences": {f"{name} − {WITH}": paired_difference(records[name], records[WITH])
                              for name in arms if name != WITH},
              "seconds (scoring, every arm, on a shared CPU)": round(sum(r["seconds"] for rs in records.values()
                                                                          for r in rs))}
    result["differences"].update({f"{name} − {WITHOUT}": paired_difference(records[name], records[WITHOUT])
                                  for name in arms if name not in (WITH, WITHOUT)})
    if len(named) > 1:
        result["sink_logits"]["largest |mean − median|"] = (named["mean"] - named["median"]).abs().max().item()
    common.save_results(RESULTS, result)
    for name in arms:
        print(f"{name}: {result['arms'][name]['score']:.1f}")
    for name, diff in result["differences"].items():
        print(f"{name}: {diff['difference']:+.1f} (95% interval {diff['ci'][0]:+.1f} to {diff['ci'][1]:+.1f}, "
              f"{diff['samples']} samples)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=8, help="samples per task (niah_single, niah_multi, qa)")
    parser.add_argument("--median", action="store_true", help="a fourth arm: sink logits calibrated by the median")
    parser.add_argument("--resume", action="store_true", help="continue the log of an earlier run")
    parser.add_argument("--report", action="store_true",
                        help="score nothing: write the results of the samples the log holds for every arm")
    args = parser.parse_args()
    model, tokenizer = headwise.load_model("smollm2-135m", task="lm", dtype="float32")
    sink, window = 4, default_window(BUDGET, CONTEXT, 4)  # kv_policy's defaults at this budget and length
    if args.report:
        header = json.loads(LOG.read_text(encoding="utf-8").splitlines()[0])
        log = ResultLog(LOG, {k: v for k, v in header.items() if k not in ("format", "version")})
        reductions = ["mean", "median"] if args.median else ["mean"]
        report(log, calibrated(model, tokenizer, sink, window, reductions), sink, window)
        return
    policy, _ = kv_policy(model, tokenizer, kv_budget=BUDGET, context=CONTEXT, sink=sink, window=window,
                          progress=False)
    plain = without_sinks(policy)
    logits = calibrated(model, tokenizer, sink, window, ["mean", "median"] if args.median else ["mean"])
    arms = {WITH: lambda m, n: PolicyCache(policy, length=n), WITHOUT: lambda m, n: PolicyCache(plain, length=n)}
    for r, values in logits.items():
        arms[f"sink logit, {r} (vLLM's attention sinks)"] = lambda m, n, v=values: sink_logit_cache(plain, v, n)
    task = LongContext(None, (CONTEXT,), args.samples, tasks=VERIFY_TASKS)
    spec = task.spec()
    if LOG.exists() and not args.resume:
        LOG.unlink()
    log = ResultLog(LOG, {"policy": policy.describe(), "drawn_from": spec.describe(), "calibration": CALIBRATION})
    headwise.apply_kv_policy(model, policy)  # the headwise attention path; each arm brings its own cache
    keys = sorted(spec.keys(), key=lambda k: (k[2], k[0]))  # every task's sample i before any sample i + 1
    for task_name, length, index in keys:
        key = f"{task_name}/{length}/{index}"
        sample = None
        for name, make_cache in arms.items():
            if log.get(name, key) is None:
                sample = sample or draw(tokenizer, task_name, length, index, spec)
                log.add(name, run_sample(model, tokenizer, sample, make_cache))
        print(key, {name: round(log.get(name, key)["score"], 1) for name in arms}, flush=True)
    report(log, logits, sink, window)


if __name__ == "__main__":
    main()
