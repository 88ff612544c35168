"""Story of heads (Voita et al. 2019) on the real Multi30k de→en Marian model: L0 per attention kind, roles of
the survivors, gradient importance next to confidence.

Phases (each cached in the results JSON, so a killed run resumes at the first unfinished one; ``--phases``
picks a subset, each phase stays under ~8 minutes on one shared CPU thread):

- ``baseline``: greedy BLEU of ``multi30k-marian-de-en`` on test_2016_flickr;
- ``control``: the model fine-tuned ``--steps`` updates on train with nothing else (the control for L0);
- ``l0-<K>``: Hard-Concrete gates on all 72 heads, λ by dual ascent towards ``K`` open heads (target reached
  linearly over the first half of the updates, as ``headwise prune --strategy l0``), ``--steps`` updates with the
  label loss; open heads per kind traced every 5 updates; then exactly ``K`` heads kept (``keep_l0_heads``, at
  least one per layer), the rest removed physically; greedy test BLEU of the smaller model;
- ``analysis``: ``headwise.analysis.analyze_seq2seq`` on the baseline over val: Voita's roles (positional,
  rare-token, alignment by the diagonal proxy: Multi30k has no gold word alignments here), confidence, and
  Michel gradient importance of the label loss, for every head of every kind.

    python experiments/mt_story_of_heads.py --phases baseline,control,l0-36   # writes experiments/results/mt_story_of_heads.json
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from transformers import TrainerCallback

import common
import headwise
from headwise.pruning import L0Config, L0Penalty, L0Training, add_l0_gates, keep_l0_heads, l0_gates
from headwise.sites import find_sites
from headwise.tasks import get_task
from headwise.training import finetune

OUT = common.RESULTS / "mt_story_of_heads.json"
MODEL = "multi30k-marian-de-en"
KINDS = ("enc-self", "dec-self", "dec-enc")


class GateTrace(TrainerCallback):
    """Open L0 heads per kind (eval gate > 0) every ``every`` updates."""

    def __init__(self, model, every: int) -> None:
        self.model, self.every, self.trace = model, every, []
        self.kind = {s.path: s.kind for s in find_sites(model)}

    def record(self, step: int) -> None:
        counts = dict.fromkeys(KINDS, 0)
        for path, gate in l0_gates(self.model).items():
            counts[self.kind[path]] += int((gate.eval_gates() > 0).sum())
        self.trace.append({"step": step, **counts})

    def on_train_begin(self, args, state, control, **kwargs):
        self.record(0)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every == 0:
            self.record(state.global_step)


def per_kind(model, removed: dict[str, list[int]]) -> dict:
    """Survivors ``{kind: {layer: [heads]}}`` and counts per kind after ``keep_l0_heads``."""
    survivors = {k: {} for k in KINDS}
    for site in find_sites(model):
        gone = set(removed.get(site.name, []))
        original = site.num_heads + len(gone)
        survivors[site.kind][str(site.layers[0])] = [h for h in range(original) if h not in gone]
    return {"survivors": survivors, "kept": {k: sum(len(v) for v in survivors[k].values()) for k in KINDS}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--phases", default="baseline,control,l0-36,l0-18,analysis")
    p.add_argument("--steps", type=int, default=30, help="fine-tuning updates per arm (batch 64 pairs)")
    p.add_argument("--limit", type=int, default=500, help="first N test pairs scored (all: 1000)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--head-lr", type=float, default=0.3, help="learning rate of the L0 gates (Adam)")
    p.add_argument("--lambda-lr", type=float, default=0.05, help="dual-ascent step of the L0 coefficient")
    p.add_argument("--learning-rate", type=float, default=3e-4)
    p.add_argument("--analysis-pairs", type=int, default=500, help="val pairs for roles/confidence")
    p.add_argument("--importance-pairs", type=int, default=128, help="train pairs for gradient importance")
    p.add_argument("--out", default=str(OUT))
    common.add_device(p)
    args = p.parse_args()
    out = Path(args.out)
    results = common.load_results(out)
    results.setdefault("setup", {
        "model": MODEL, "eval": f"greedy sacreBLEU, test_2016_flickr (first {args.limit} pairs), max_new_tokens 96",
        "train": f"Multi30k train, batches of {args.batch_size} pairs, AdamW lr {args.learning_rate}, "
                 f"{args.steps} updates per arm (~{args.steps * args.batch_size / 29000:.2f} epoch), seed 0",
        "l0": f"Hard-Concrete gates on all 72 heads (log alpha 3), lambda by dual ascent (lambda_lr {args.lambda_lr}), "
              f"target reached linearly over the first half, gate lr {args.head_lr}; then exactly K heads kept and "
              "removed"})
    task = get_task("translation", batch_size=args.batch_size, limit=args.limit)
    train = {"max_steps": args.steps, "batch_size": args.batch_size, "learning_rate": args.learning_rate,
             "progress": False}

    def bleu(model, tok) -> float:
        return round(task.evaluate(model, tok, progress=False)["bleu"], 2)

    for phase in args.phases.split(","):
        if phase in results:
            print(f"{phase}: cached")
            continue
        start = time.time()
        model, tok = headwise.load_model(MODEL, task=task, device=args.device)
        if phase == "baseline":
            results[phase] = {"bleu": bleu(model, tok)}
        elif phase == "control":
            finetune(model, tok, task, **train)
            results[phase] = {"bleu": bleu(model, tok)}
        elif phase.startswith("l0-"):
            keep = int(phase[3:])
            add_l0_gates(model, L0Config(init=3.0))
            training = L0Training(lam=0.0, target_heads=keep, lambda_lr=args.lambda_lr, target_warmup=args.steps // 2)
            penalty, trace = L0Penalty(model, training), GateTrace(model, 5)
            finetune(model, tok, task, penalties=[penalty], head_learning_rate=args.head_lr, callbacks=[trace],
                     **train)
            trace.record(args.steps)
            open_end = trace.trace[-1]
            removed = keep_l0_heads(model, keep)
            results[phase] = {"target": keep, "open_after_l0": {k: open_end[k] for k in KINDS},
                              "final_lambda": round(penalty.lam, 4), "trace": trace.trace,
                              **per_kind(model, removed), "parameters": sum(x.numel() for x in model.parameters()),
                              "bleu": bleu(model, tok)}
        elif phase == "analysis":
            from headwise.analysis import analyze_seq2seq

            batches = task.calibration_inputs(tok, limit=args.analysis_pairs, batch_size=32)
            loss_batches = task.batches(tok, "train", 16, args.importance_pairs)
            results[phase] = analyze_seq2seq(model, batches, loss_fn=task.loss, loss_inputs=loss_batches,
                                             progress=False).to_dict()
        else:
            raise SystemExit(f"unknown phase {phase!r}")
        results[phase]["seconds"] = round(time.time() - start, 1)
        common.save_results(out, results)
        print(phase, {k: v for k, v in results[phase].items() if k in ("bleu", "kept", "open_after_l0", "seconds")},
              flush=True)


if __name__ == "__main__":
    main()
