"""MHR (head swapping and alpha mixing) on the Multi30k de→en Marian model, against a control fine-tune with the
same number of updates: ΔBLEU (greedy, test_2016_flickr), every arm through ``headwise mix --task translation``.

Arms (each one ``headwise mix`` run, cached in the results JSON; ``--arms`` picks a subset):

- ``control``: ``--finetune F --no-mixers`` with no swap: a plain fine-tune, the control for the arms below;
- ``swap-<kind>``: heads 0-3 of layer 0 ↔ layer 2 of one kind (q/k/v weights; the output projection stays, as in
  MHR), BLEU right after the swap, no training;
- ``swap-ft``: the swaps of every kind, then ``--finetune F --no-mixers`` (MHR's static swap, trained);
- ``mix``: alpha mixers on every site with the nuclear-norm term (``--gamma``), ``--finetune F``, folded.

    python experiments/mt_mhr.py --arms control,swap-enc-self     # writes experiments/results/mt_mhr.json
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

OUT = common.RESULTS / "mt_mhr.json"
KINDS = ("enc-self", "dec-self", "dec-enc")


def swaps(kinds: tuple[str, ...]) -> list[str]:
    return [a for kind in kinds for h in range(4) for a in ("--swap", f"{kind}.0:{h} <-> {kind}.2:{h}")]


def arm_args(arm: str, epochs: float, gamma: float) -> list[str]:
    tune = ["--finetune", str(epochs)]
    if arm == "control":
        return [*tune, "--no-mixers"]
    if arm == "swap-ft":
        return [*swaps(KINDS), *tune, "--no-mixers"]
    if arm == "mix":
        return [*tune, "--gamma", str(gamma)]
    if arm.startswith("swap-") and arm[5:] in KINDS:
        return swaps((arm[5:],))
    raise SystemExit(f"unknown arm {arm!r}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arms", default="control,swap-enc-self,swap-dec-self,swap-dec-enc,swap-ft,mix")
    p.add_argument("--epochs", type=float, default=0.25, help="fine-tuning epochs (batches of 64 pairs)")
    p.add_argument("--gamma", type=float, default=0.1, help="nuclear-norm coefficient of the mix arm")
    p.add_argument("--limit", type=int, default=None, help="first N test pairs scored (default: all 1,000)")
    p.add_argument("--out", default=str(OUT))
    common.add_device(p)
    args = p.parse_args()
    out = Path(args.out)
    results = common.load_results(out, {"arms": {}})
    for arm in args.arms.split(","):
        if arm in results["arms"]:
            print(f"{arm}: cached")
            continue
        command = [sys.executable, "-m", "headwise.cli", "mix", "--task", "translation", "--model",
                   "multi30k-marian-de-en", "--split", "test_2016_flickr", *arm_args(arm, args.epochs, args.gamma),
                   *(["--limit", str(args.limit)] if args.limit else []),
                   *(["--device", args.device] if args.device != "cpu" else []), "--json",
                   "--out", tempfile.mkdtemp(prefix="mt-mhr-"), "--force"]
        run = subprocess.run(command, capture_output=True, text=True, env=os.environ)
        if run.returncode:
            raise SystemExit(run.stderr[-2000:])
        result = json.loads(run.stdout.strip().splitlines()[-1])
        result["command"] = "headwise " + " ".join(f"'{a}'" if " " in a else a for a in command[3:-3])
        results["arms"][arm] = result
        common.save_results(out, results)
        print(arm, result["metric_before"], result["metric_after_swaps"], result["metric_after"], flush=True)


if __name__ == "__main__":
    main()
