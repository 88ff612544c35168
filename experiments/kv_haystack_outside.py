"""Why the default KV policy loses more on natural prose than on the generated haystack (issue 68): the attention
mass each streamed head drops, per haystack, without generating anything.

For each of the suite's haystacks (generated, prose, docs, code), ``--texts`` plain texts of ``--length`` tokens
are read from the haystack (seeded offsets) and run once through SmolLM2; per KV head (the max over its query
heads) the ``outside`` score: the attention mass beyond sink 4 + window 252 that a streaming head would drop (the
default policy's rule at 0.5 × 2048). Reported per haystack: the mean dropped mass over the heads the default
policy streams and over those it keeps full, and how far the heads' order by dropped mass agrees between haystacks
(Spearman), and with the policy's choice (how many of the policy's full heads are among the top heads by dropped
mass). The policy comes from kv_policy's calibration (passkeys and fact lookups in filler, seed 0; the scores
``kv_long_suite.py`` cached).

  python experiments/kv_haystack_outside.py --texts 2
Writes RESULTS/kv_haystack_outside.json and .md.
"""

from __future__ import annotations

import argparse
import random
import statistics

import torch

import common

HAYSTACKS = ("generated", "prose", "docs", "code")


def spearman(a: list[float], b: list[float]) -> float:
    def ranks(x: list[float]) -> list[float]:
        order = sorted(range(len(x)), key=x.__getitem__)
        r = [0.0] * len(x)
        for i, j in enumerate(order):
            r[j] = float(i)
        return r

    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    return cov / (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--texts", type=int, default=2)
    p.add_argument("--length", type=int, default=2048)
    args = p.parse_args()

    import headwise
    from headwise.kvcache import HeadScores, kv_policy
    from headwise.kvcache.scores import _outside
    from headwise.tasks.haystacks import Haystack
    from kv_long_suite import calibrated_scores, commit

    model, tokenizer = headwise.load_model(args.model, task="lm")
    headwise.enable(model)
    model.eval()
    sink, window = 4, 252
    policy, _ = kv_policy(model, tokenizer, 0.5, args.length, sink, window,
                          scores=calibrated_scores(model, tokenizer, "filler", args.model), progress=False)
    full = set(policy.full_heads())
    layers, heads = len(policy.heads), len(policy.heads[0])
    pairs = [(layer, h) for layer in range(layers) for h in range(heads)]
    per_haystack: dict[str, list[float]] = {}
    for name in HAYSTACKS:
        hay = Haystack.of(name)
        total = {"outside": None}
        sums = None
        for t in range(args.texts):
            units = hay.units(random.Random(f"outside/{name}/{t}"))
            text = ""
            while len(tokenizer(text, add_special_tokens=False)["input_ids"]) < args.length:
                text += "".join(next(units) for _ in range(20))
            ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"][: args.length])
            total = {"outside": torch.zeros(layers, model.config.num_attention_heads)}
            _outside(model, ids, sink, window, total)
            sums = total["outside"] if sums is None else sums + total["outside"]
        kv = HeadScores({"outside": sums / args.texts}, [heads] * layers).kv("outside")
        per_haystack[name] = [float(kv[layer, h]) for layer, h in pairs]
        print(name, "done", flush=True)
    out = {"commit": commit(), "model": args.model, "texts": args.texts, "length": args.length, "sink": sink,
           "window": window, "full_heads": len(full), "haystacks": {}}
    top = len(full)
    for name, values in per_haystack.items():
        streamed = [v for pair, v in zip(pairs, values) if pair not in full]
        kept = [v for pair, v in zip(pairs, values) if pair in full]
        order = sorted(range(len(pairs)), key=lambda i: -values[i])[:top]
        out["haystacks"][name] = {
            "dropped_mass_streamed": statistics.fmean(streamed), "dropped_mass_full": statistics.fmean(kept),
            "full_heads_among_top_dropping": sum(pairs[i] in full for i in order),
            "spearman": {other: spearman(values, per_haystack[other]) for other in per_haystack}}
    common.save_results(common.RESULTS / "kv_haystack_outside.json", out)
    rows = ["| haystack | mass dropped, streamed heads | mass a full head would drop | policy's full heads among "
            f"the top {top} by dropped mass | Spearman with " + ", ".join(HAYSTACKS) + " |", "|---|---|---|---|---|"]
    for name, h in out["haystacks"].items():
        rows.append(f"| {name} | {h['dropped_mass_streamed']:.3f} | {h['dropped_mass_full']:.3f} | "
                    f"{h['full_heads_among_top_dropping']}/{top} | "
                    + ", ".join(f"{h['spearman'][o]:.2f}" for o in HAYSTACKS) + " |")
    text = "\n".join([f"# Attention mass a sink {sink} + window {window} head drops, per haystack ({args.model})", "",
                      f"Commit {out['commit']}. {args.texts} texts of {args.length} tokens per haystack; per KV head "
                      "the max over its query heads of the mean mass beyond the window (queries that drop anything); "
                      f"the default policy at 0.5 × {args.length} keeps {top} KV heads full.", "", *rows, ""])
    common.atomic_write_text(common.RESULTS / "kv_haystack_outside.md", text)
    print(text)


if __name__ == "__main__":
    main()
