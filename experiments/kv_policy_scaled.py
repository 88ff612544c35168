"""Windows that scale with the sequence against fixed ones, on SmolLM2-135M-Instruct: does one policy serve every
length, and what does it cost in quality?

Policies at ``kv_budget=0.5`` (``headwise.kv_policy``: retrieval ranking on its synthetic passkey prompts, sink 4,
window ``3/4 · 0.5 · C − 4``), sized for C = 2,048 and C = 8,192 tokens, each with a fixed window
(``scaled=False``) and a scaled one (the default: a cache built for L tokens takes the window ``W·L // C``).
Each is measured at ``--lengths`` tokens beside the full cache, on data no default was chosen on:

- perplexity on the last 10% of WikiText-2 valid.txt (``--max-tokens`` tokens in windows of the measured length),
  every window one prefill through the policy's cache (``policy_forward``: each head's rule on every query);
- passkey retrieval on ``text`` prompts (WikiText haystack, 5 depths, ``--keys`` keys per depth, seed 1000) through
  ``generate()`` (not run at 8k unless ``--passkey-8k``: minutes per arm on a CPU);
- the share of the full cache's bytes each policy holds at that length (``KVPolicy.kv_fraction``).

    python experiments/kv_policy_scaled.py                  # writes experiments/results/kv_policy_scaled.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import headwise
from headwise.kvcache import KVPolicy, policy_forward
from headwise.kvcache.passkey import PromptFamily, family_prompts, passkey_accuracy
from headwise.models import resolve_model
from headwise.tasks.lm import LanguageModeling

OUT = Path(__file__).resolve().parent / "results" / "kv_policy_scaled.json"
SIZED = (2048, 8192)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="2048", help="comma-separated measured lengths (default 2048)")
    parser.add_argument("--arms", default="full,fixed@2k,scaled@2k,fixed@8k,scaled@8k", help="which policies")
    parser.add_argument("--max-tokens", type=int, default=4096, help="evaluated tokens per length")
    parser.add_argument("--keys", type=int, default=1, help="passkeys per depth (5 depths)")
    parser.add_argument("--passkey-8k", action="store_true", help="also the passkey check at 8,192 tokens")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.manual_seed(0)
    path = resolve_model("smollm2-135m")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="headwise").eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    started = time.perf_counter()
    _, scores = headwise.kv_policy(model, tokenizer, kv_budget=0.5, context=2048, progress=False)
    policies = {"full": KVPolicy.uniform(model)}
    for context in SIZED:
        for scaled in (False, True):
            policy, _ = headwise.kv_policy(model, tokenizer, kv_budget=0.5, context=context, scores=scores,
                                           scaled=scaled)
            policies[f"{'scaled' if scaled else 'fixed'}@{context // 1024}k"] = policy
    result = {"model": "smollm2-135m (fp32)", "ranking": "retrieval (synthetic passkey prompts)",
              "data": "WikiText-2 valid.txt, last 10% (perplexity); text-haystack passkeys, seed 1000",
              "policies": {name: p.describe() for name, p in policies.items()}, "rows": {}}
    eval_text = None
    policies = {name: policies[name] for name in args.arms.split(",")}
    for length in (int(n) for n in args.lengths.split(",")):
        task = LanguageModeling(max_length=length, max_tokens=args.max_tokens)
        eval_text = eval_text or "\n".join(line for line in task.texts("eval") if line.strip())
        prompts = family_prompts(tokenizer, PromptFamily.parse("text"), length, [0.0, 0.25, 0.5, 0.75, 1.0],
                                 args.keys, 1000, eval_text)
        for name, policy in policies.items():
            with policy_forward(model, policy):
                ppl = task.evaluate(model, tokenizer)["perplexity"]
            row = {"perplexity": ppl, "kv_fraction": policy.kv_fraction(length)}
            if length == 2048 or args.passkey_8k:
                headwise.apply_kv_policy(model, policy)
                check = passkey_accuracy(model, tokenizer, prompts, progress=False)
                headwise.remove_kv_policy(model)
                row["passkey"] = f"{check['correct']}/{check['prompts']}"
            result["rows"][f"{name}@{length}"] = row
            print(f"{name} at {length}: {row} ({time.perf_counter() - started:.0f} s)", flush=True)
    result["seconds"] = time.perf_counter() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
