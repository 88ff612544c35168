"""MiniLM on STS-B with 36 of its 72 heads: recovery with distillation from the fine-tuned unpruned model.

The teacher is the packaged all-MiniLM-L6-v2 fine-tuned with the shared recipe (cosine-similarity regression on
STS-B train, 1 epoch, batch 16, lr 2e-5, 10% warm-up, seed 0); it is trained once and cached under ``--out``.
Runs (``--runs``, comma-separated; ``E`` = recovery epochs):

- ``l0``: L0 gates trained jointly with the task loss for 1 epoch from the packaged model, 36 heads kept
  (``headwise prune --strategy l0 --keep 36``); cached per seed, the start of the ``l0+…`` runs;
- ``l0+distill:E`` / ``l0+finetune:E``: then ``headwise.recover`` with distillation from the teacher, or the
  task loss only, for E epochs;
- ``importance+distill:E``: one-shot gradient importance on the teacher (256 train pairs), the 36 most important
  heads kept, then E epochs of distillation;
- ``l0-distill`` / ``l0-distill+distill:E``: distillation from the teacher during the L0 phase too.

``--teacher packaged`` distils from the packaged (not fine-tuned) model instead, and importance then ranks the
heads of the packaged model: what ``headwise prune --recover distill`` does without ``--teacher``. ``--max-steps``
cuts every recovery to N steps (quick comparisons; L0 always trains 1 epoch).

Distillation: ``(1 − α) · task loss + α · MSE (or 1 − cos) between the student's and the teacher's mean-pooled
embeddings`` (``--alpha``, ``--distance``). Every run appends to ``experiments/results/minilm_36_heads_recovery.json``
(re-running a run with the same settings replaces it); the summary takes the median over seeds.

    python experiments/minilm_36_heads_recovery.py --runs l0,l0+distill:1 --seeds 0
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import common
import headwise
from headwise.tasks import Stsb
from headwise.training.recipes import importance_prune, l0_prune
from headwise.training import finetune_stsb

RESULTS = common.RESULTS / "minilm_36_heads_recovery.json"
KEEP = 36


def score(model, tokenizer) -> float:
    return round(float(Stsb().evaluate(model, tokenizer, progress=False)["spearman"]), 2)


def cached(path: Path, build, device: str = "cpu"):
    """The model saved at ``path`` (moved to ``device``), or ``build()`` saved there first; returns (model, seconds
    spent building)."""
    if (path / "config.json").is_file():
        return headwise.from_pretrained(path).to(device), 0.0
    start = time.time()
    model, tokenizer = build()
    headwise.save_pretrained(model, path, tokenizer, overwrite=True)
    return model, time.time() - start


def record(entry: dict, results: Path = RESULTS) -> None:
    """Append ``entry`` to the results (replacing a run with the same settings) and refresh the summary."""
    key = ("name", "seed", "alpha", "temperature", "distance", "teacher_model", "max_steps")

    def update(data: dict) -> None:
        data["runs"] = [r for r in data["runs"] if tuple(r.get(k) for k in key) != tuple(entry[k] for k in key)]
        data["runs"].append(entry)
        summarize(data)

    common.merge_results(results, update, default={"runs": []})


def summarize(data: dict) -> dict:
    """Medians over seeds per setting; ``reaches_88_83`` only for the acceptance setting (fine-tuned teacher, whole
    epochs), None otherwise."""
    groups: dict[tuple, list[dict]] = {}
    for r in data["runs"]:
        groups.setdefault((r["name"], r["alpha"], r["temperature"], r["distance"], r.get("teacher_model", "fine-tuned"),
                           r.get("max_steps", -1)), []).append(r)
    data["summary"] = [
        {"name": n, "alpha": a, "temperature": t, "distance": d, "teacher_model": tm, "max_steps": ms,
         "teacher": rs[-1]["teacher"], "seeds": sorted(r["seed"] for r in rs),
         "median_after_l0": _median([r["after_l0"] for r in rs]),
         "median_before_recovery": _median([r["before_recovery"] for r in rs]),
         "median_after_recovery": statistics.median(r["after_recovery"] for r in rs),
         "reaches_88_83": statistics.median(r["after_recovery"] for r in rs) >= 88.83
         if tm == "fine-tuned" and ms == -1 else None}
        for (n, a, t, d, tm, ms), rs in sorted(groups.items(), key=str)]
    data["setup"] = ("all-MiniLM-L6-v2 (6 x 12 heads), STS-B dev Spearman x100; teacher_model fine-tuned: the "
                     "shared recipe (1 epoch, batch 16, lr 2e-5, 10% warm-up, seed 0), packaged: the packaged model "
                     "as is; recovery batch 16, lr 2e-5, 10% warm-up, max_steps -1 = whole epochs; 1 torch thread "
                     "on a shared CPU for device cpu (minutes are not comparable)")
    return data


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="l0,l0+distill:1")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--temperature", type=float, default=2.0)
    parser.add_argument("--distance", default="mse", choices=("mse", "cosine"))
    parser.add_argument("--teacher", default="fine-tuned", choices=("fine-tuned", "packaged"))
    parser.add_argument("--max-steps", type=int, default=-1, help="cut every recovery to N steps")
    parser.add_argument("--out", default="/tmp/headwise-minilm-recovery", help="cache of the teacher and L0 models")
    parser.add_argument("--model", default=None, help="the packaged all-MiniLM-L6-v2 unless a folder is given")
    common.add_device(parser)
    parser.add_argument("--results", default=str(RESULTS), help="the results JSON (appended to)")
    args = parser.parse_args()
    out, task = Path(args.out), Stsb()

    def load():
        """The starting model in float32 on ``--device`` (a float16 copy of the weights is upcast)."""
        return headwise.load_model(args.model, device=args.device, dtype="float32")

    _, tokenizer = load()

    def fine_tuned():
        model, tok = load()
        return finetune_stsb(model, tok, seed=0, progress=False), tok

    teacher, teacher_score = None, None
    if any(r != "l0" for r in args.runs.split(",")):  # every other run reads the teacher
        teacher, _ = cached(out / "teacher", fine_tuned, args.device) if args.teacher == "fine-tuned" else \
            (load()[0], 0.0)
        teacher_score = score(teacher, tokenizer)
        print(f"teacher {teacher_score}", flush=True)
    distill = dict(alpha=args.alpha, temperature=args.temperature, distance=args.distance)

    for seed in map(int, args.seeds.split(",")):
        for run in args.runs.split(","):
            start, (phase, _, epochs) = time.time(), run.partition(":")
            epochs = float(epochs) if epochs else 0.0
            base, _, mode = phase.partition("+")
            after_l0 = None
            if base in ("l0", "l0-distill"):
                def pruned(base=base):
                    model, tok = load()
                    extra = {"teacher": teacher, **distill} if base == "l0-distill" else {}
                    l0_prune(model, tok, KEEP, task, seed=seed, progress=False, **extra)
                    return model, tok

                tag = "" if base == "l0" else f"-a{args.alpha}-{args.distance}"
                model, _ = cached(out / f"{base}{tag}-seed{seed}", pruned, args.device)
                after_l0 = score(model, tokenizer)
            elif base == "importance":
                model = copy.deepcopy(teacher)
                importance_prune(model, tokenizer, KEEP, task, examples=256, progress=False)
            else:
                raise SystemExit(f"unknown run {run!r}")
            before = after_l0 if after_l0 is not None else score(model, tokenizer)
            if mode:
                headwise.recover(model, tokenizer, task, teacher=teacher, mode=mode, epochs=epochs, seed=seed,
                                 max_steps=args.max_steps, progress=False, **distill)
            after = score(model, tokenizer) if mode else before
            heads = sum(s.num_heads for s in headwise.find_sites(model))
            entry = {"name": run, "seed": seed, **distill, "teacher_model": args.teacher,
                     "max_steps": args.max_steps, "heads": heads, "teacher": teacher_score,
                     "after_l0": after_l0, "before_recovery": before, "after_recovery": after,
                     "minutes": round((time.time() - start) / 60, 1), "device": args.device}
            record(entry, Path(args.results))
            print(json.dumps(entry), flush=True)


if __name__ == "__main__":
    main()
