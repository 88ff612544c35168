"""Cost of streaming analysis vs. the spiqa way (eager forward with ``output_attentions=True``, maps kept).

Each side runs in its own fresh process (so peak RSS is its own), over the same STS-B dev sentences; the pair
is repeated and medians are reported. Writes a section of docs/benchmarks.md.
Run: ``python benchmarks/analysis_cost.py [--texts 512] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from common import machine, median, update_section

CHILD = r"""
import json, resource, sys, time, torch
import headwise
from headwise.analysis import analyze
from headwise.tasks import read_stsb
mode, n, batch = sys.argv[1], int(sys.argv[2]), 32
model, tok = headwise.load_model()
texts = read_stsb("dev").sentences()[:n]
start = time.perf_counter()
if mode == "analysis":
    stats = analyze(model, tok, texts, importance=(), examples=0, batch_size=batch, progress=False)
    tokens = stats.to_dict()["tokens"]
else:
    model.set_attn_implementation("eager")
    maps, tokens = [], 0
    with torch.no_grad():
        for i in range(0, n, batch):
            enc = tok(texts[i:i + batch], padding=True, truncation=True, return_tensors="pt")
            maps.append([a.clone() for a in model(**enc, output_attentions=True).attentions])
            tokens += int(enc["attention_mask"].sum())
elapsed = time.perf_counter() - start
print(json.dumps({"seconds": elapsed, "tokens": tokens, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run(mode: str, n: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(n)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--texts", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, list[dict]] = {"analysis": [], "eager+maps": []}
    for _ in range(args.repeats):
        for mode in results:
            results[mode].append(run(mode if mode == "analysis" else "eager", args.texts))
    t = {m: median([r["seconds"] for r in rs]) for m, rs in results.items()}
    rss = {m: median([r["rss_mb"] for r in rs]) for m, rs in results.items()}
    tokens = results["analysis"][0]["tokens"]
    rows = [f"| {m} | {t[m] / tokens * 1e6:.0f} | {rss[m]:.0f} | {t[m] / t['eager+maps']:.2f} | "
            f"{rss[m] / rss['eager+maps']:.2f} |" for m in results]
    md = (f"## Analysis cost (streaming observers vs. stored eager maps)\n\nMiniLM, first {args.texts} STS-B dev "
          f"sentences ({tokens} tokens), batch 32, every metric (no importance), each side in a fresh process, "
          f"{args.repeats} alternating runs, medians. Machine: {machine()}. Goal: time ratio ≤ 1.5.\n\n"
          "| side | µs / token | peak RSS MB | time ratio | RSS ratio |\n|---|---|---|---|---|\n" + "\n".join(rows))
    print(md)
    update_section("analysis-cost", md)


if __name__ == "__main__":
    main()
