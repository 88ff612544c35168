"""spiqa (attention-probability quantization and threshold pruning) on the Multi30k de→en Marian model: greedy BLEU
vs bits and sparsity for every quantizer at 2-4 bits and for the pruning-threshold sweep, all three attention
kinds quantized at once (also during generation: every decoding step's attention is quantized).

Each chunk runs ``headwise quantize --task translation`` once and is merged into the results JSON (a chunk
already there is skipped), so each job stays under ~8 minutes on the shared CPU:

    python experiments/mt_spiqa.py --chunk thresholds      # the pruning-only sweep
    python experiments/mt_spiqa.py --chunk linear          # linear_* quantizers, 2..4 bits
    python experiments/mt_spiqa.py --chunk other           # uniform_* quantizers, 2..4 bits, binarization

Writes ``experiments/results/mt_spiqa.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import common
from headwise.quantization.functional import QUANTIZERS

OUT = common.RESULTS / "mt_spiqa.json"
CHUNKS = {
    "thresholds": ["--methods", "none", "--thresholds", "1e-4,1e-3,3e-3,0.01,0.02,0.03,0.05,0.1,0.2"],
    "linear": ["--methods", ",".join(m for m in QUANTIZERS if m.startswith("linear")), "--bits", "2..4",
               "--thresholds", "none"],
    "other": ["--methods", ",".join(m for m in QUANTIZERS if not m.startswith("linear")), "--bits", "2..4",
              "--thresholds", "none"],
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunk", choices=sorted(CHUNKS), required=True)
    p.add_argument("--limit", type=int, default=200, help="first N pairs of test_2016_flickr scored")
    p.add_argument("--out", default=str(OUT))
    common.add_device(p)
    args = p.parse_args()
    out = Path(args.out)
    results = common.load_results(out, {"chunks": {}})
    if args.chunk in results["chunks"]:
        print(f"{args.chunk}: cached")
        return
    command = [sys.executable, "-m", "headwise.cli", "quantize", "--task", "translation", "--model",
               "multi30k-marian-de-en", "--split", "test_2016_flickr", "--limit", str(args.limit), *CHUNKS[args.chunk],
               *(["--device", args.device] if args.device != "cpu" else []), "--json",
               "--out", tempfile.mkdtemp(prefix="mt-spiqa-"), "--force"]
    run = subprocess.run(command, capture_output=True, text=True, env=os.environ)
    if run.returncode:
        raise SystemExit(run.stderr[-2000:])
    result = json.loads(run.stdout.strip().splitlines()[-1])
    results["command"] = " ".join(command[1:command.index("--methods")]) + " --methods ... --json"
    results["chunks"][args.chunk] = {"command_args": CHUNKS[args.chunk], "baseline": result["baseline"],
                                     "metric_name": result["metric_name"],
                                     "rows": [{k: r[k] for k in ("label", "method", "bits", "threshold", "metric",
                                                                 "drop", "within", "sparsity", "distinct")}
                                              for r in result["rows"]], "summary": result["summary"]}
    common.save_results(out, results)
    for r in results["chunks"][args.chunk]["rows"]:
        print(f"{r['label']:40} BLEU {r['metric']:.2f} sparsity {r['sparsity']:.3f}")


if __name__ == "__main__":
    main()
