"""How wide should the streaming heads' window be at a KV budget? Held-out check for the long-context suite (issue 49).

At a budget ``B`` of a 2,048-token cache, ``kv_policy`` spends bytes two ways: wider windows on the streaming heads or
more heads kept full. Its default window made ``sink + window`` three quarters of the per-head budget (chosen on
passkeys and perplexity) until this script chose 0.25 (``kvcache.choose.WINDOW_SHARE``). It scores shares ``S`` (``sink
+ window = S · B · 2048``, as many full heads as then fit) on suite samples of **seed 1234**, which the reported
comparison (``kv_long_suite.py``, seed 4949) never draws, and the WikiText-2 perplexity (the last 10% of valid.txt,
2,048-token windows) through the same policies. Head scores: kv_policy's passkey calibration (seed 0), ranked by
``retrieval`` (the default ranking when the window was chosen; ``retrieval+lookup`` since ``kv_lookup_probe.py``).

  python experiments/kv_long_window.py suite --budget 0.5 --samples 4 --shares 0.75,0.5,0.25,0.1
  python experiments/kv_long_window.py perplexity --budgets 0.5,0.375 --shares 0.75,0.25

Prints one line an arm and the paired differences (``tasks.long.paired_difference``); scores do not depend on the
machine's load.
"""

from __future__ import annotations

import argparse

import common
import headwise
from headwise.kvcache import KVPolicy, PolicyCache, ScoreConfig, head_scores, kv_policy, policy_forward
from headwise.kvcache.choose import default_window
from headwise.tasks.long import LongContext, paired_difference, summarize

SEED = 1234  # held out: the reported suite draws seed 4949
CONTEXT = 2048


def policies(model, tokenizer, budgets: list[float], shares: list[float]) -> dict[str, KVPolicy]:
    """``{"B/shareS": the policy at budget B with window share S}``, every head ranked by one scoring."""
    scores = head_scores(model, tokenizer, ScoreConfig(), progress=False)
    out = {}
    for budget in budgets:
        for share in shares:
            window = default_window(budget, CONTEXT, 4, share)
            name = f"{budget:g}/share{share:g}"
            out[name] = kv_policy(model, tokenizer, kv_budget=budget, context=CONTEXT, window=window, scores=scores,
                                  ranking="retrieval", progress=False)[0]
            print(f"{name}: window {window}, {out[name].describe()}", flush=True)
    return out


def suite(args, model, tokenizer) -> None:
    from transformers.cache_utils import DynamicCache

    task = LongContext(lengths=str(CONTEXT), samples=args.samples, seed=SEED)
    runs = {"full": lambda m, n: DynamicCache(config=m.config)}
    for name, policy in policies(model, tokenizer, [args.budget], args.shares).items():
        runs[name] = lambda m, n, p=policy: PolicyCache(p, length=n)
    records = {}
    for arm, make in runs.items():
        records[arm] = task.run(model, tokenizer, progress=False, arm=arm, make_cache=make)
        s = summarize(records[arm])
        print(arm, f"{s['score']:.1f}", {k: round(v, 1) for k, v in s["tasks"].items()}, flush=True)
    arms = [a for a in records if a != "full"]
    for a in arms:
        d = paired_difference(records[a], records["full"])
        print(a, "- full", f"{d['difference']:+.1f}", [round(x, 1) for x in d["ci"]])
    for a in arms[1:]:
        d = paired_difference(records[a], records[arms[0]])
        print(a, "-", arms[0], f"{d['difference']:+.1f}", [round(x, 1) for x in d["ci"]])


def perplexity(args, model, tokenizer) -> None:
    from headwise.tasks import LanguageModeling

    text = str(common.data_file(args.data, common.WIKITEXT))
    task = LanguageModeling(data=text, max_length=CONTEXT, max_tokens=args.tokens)
    arms = {"full": KVPolicy.uniform(model), **policies(model, tokenizer, args.budgets, args.shares)}
    for name, rules in arms.items():
        with policy_forward(model, rules):
            result = task.evaluate(model, tokenizer, progress=False)
        print(name, f"perplexity {result['perplexity']:.3f}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("suite", "perplexity"))
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--budget", type=float, default=0.5)
    p.add_argument("--budgets", default="0.5,0.375")
    p.add_argument("--samples", type=int, default=4, help="suite samples per task")
    p.add_argument("--shares", default="0.75,0.5,0.25,0.1")
    p.add_argument("--data", default=None, help="perplexity text (default: shared/data/wikitext-2/valid.txt)")
    p.add_argument("--tokens", type=int, default=16384, help="perplexity tokens")
    args = p.parse_args()
    args.shares = [float(s) for s in args.shares.split(",")]
    args.budgets = [float(b) for b in args.budgets.split(",")]
    model, tokenizer = headwise.load_model(args.model, task="lm")
    headwise.enable(model)
    model.eval()
    {"suite": suite, "perplexity": perplexity}[args.command](args, model, tokenizer)


if __name__ == "__main__":
    main()
