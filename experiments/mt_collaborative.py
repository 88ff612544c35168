"""Collaborative heads (Cordonnier et al.) on the Multi30k de→en Marian model: greedy BLEU vs the shared query/key
width D~k, one attention kind converted at a time (cross-attention included), no re-fine-tuning.

Each kind's sites are compressed with the data-aware objective (attention-score error on 256 teacher-forced val
pairs, what ``headwise compress --task translation --calibration task`` does); D~k = H·d = 256 is exact.

    python experiments/mt_collaborative.py --kinds dec-enc,enc-self,dec-self --dks 128,64,32
    # writes experiments/results/mt_collaborative.json (settings already there are skipped)
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import common
import headwise
from headwise.collaborative import CollaborativeConfig, compress, input_moments
from headwise.sites import select_sites
from headwise.tasks import get_task

OUT = common.RESULTS / "mt_collaborative.json"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kinds", default="dec-enc,enc-self,dec-self")
    p.add_argument("--dks", default="128,64,32")
    p.add_argument("--limit", type=int, default=500, help="first N test pairs scored (all: 1000)")
    p.add_argument("--calibration", type=int, default=256, help="val pairs for the score objective")
    p.add_argument("--out", default=str(OUT))
    common.add_device(p)
    args = p.parse_args()
    out = Path(args.out)
    results = common.load_results(out, {"runs": {}})
    results["setup"] = {"model": "multi30k-marian-de-en", "eval": f"greedy sacreBLEU, test_2016_flickr (first "
                        f"{args.limit} pairs)", "objective": f"attention-score error on {args.calibration} "
                        "teacher-forced val pairs (ALS, 20 sweeps, block init)", "exact_dk": 256}
    task = get_task("translation", limit=args.limit)
    model, tok = headwise.load_model("multi30k-marian-de-en", task=task, device=args.device)
    calibration = task.calibration_inputs(tok, limit=args.calibration, batch_size=32)
    for kind in args.kinds.split(","):
        moments = None
        for dk in (int(d) for d in args.dks.split(",")):
            key = f"{kind}@{dk}"
            if key in results["runs"]:
                print(f"{key}: cached")
                continue
            start = time.time()
            config = CollaborativeConfig(dk=dk, kinds=[kind])
            if moments is None:
                moments = input_moments(model, select_sites(model, [kind]), calibration)
            edited = copy.deepcopy(model)
            result = compress(edited, config=config, moments=moments)
            bleu = task.evaluate(edited, tok, progress=False)["bleu"]
            results["runs"][key] = {"kind": kind, "dk": dk, "bleu": round(bleu, 2),
                                    "score_error": [round(s.score_error, 4) for s in result.sites],
                                    "qk_params_before": result.params_before, "qk_params_after": result.params_after,
                                    "seconds": round(time.time() - start, 1)}
            common.save_results(out, results)
            print(key, results["runs"][key], flush=True)


if __name__ == "__main__":
    main()
