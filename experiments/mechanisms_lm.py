"""SmolLM2-135M with each causal mechanism at all 30 attention sites: WikiText-2 perplexity zero-shot and after a
short fine-tune, against exact softmax attention under the same recipe.

What ``headwise replace <mechanism> --task lm --model smollm2-135m --max-length 256 --finetune ...`` does, row by
row, with a step count instead of epochs. Data: the shared WikiText-2 file with the ``lm`` task's split (first 90%
of lines train, last 10% evaluate); windows of ``--max-length`` tokens (disjoint, for training and evaluation),
evaluation on the first ``--eval-tokens`` tokens of the evaluation part. Fine-tune: the ``lm`` task's recipe
(``Task.finetune``: AdamW, 10% warm-up, linear decay, all parameters) for ``--steps`` updates of ``--batch-size``
windows at ``--lr``, seed 0 — identical for every row, softmax included. Mechanism sizes are well below the window
(window 32, chunks of 8, 64 features), so that every one approximates.

Results accumulate in ``--out`` (a row's zero-shot value is kept when it is later fine-tuned):
    python experiments/mechanisms_lm.py --steps 0 --all   # zero-shot perplexity of every row
    python experiments/mechanisms_lm.py softmax            # fine-tune one row (40 updates: the docs' setting)
    python experiments/mechanisms_lm.py --list             # the rows
    python experiments/mechanisms_lm.py                    # no rows: the markdown table of docs/mechanisms.md
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

import common
from headwise.mechanisms import apply
from headwise.models import load_model
from headwise.tasks import get_task
from headwise.training import finetune

OUT = common.EXPERIMENTS / "mechanisms_lm.json"
ROWS = {  # label -> (mechanism or None for the unchanged model, args)
    "softmax": (None, {}),
    "local w=32": ("local", {"window": 32}),
    "local block w=32": ("local", {"window": 32, "mode": "block"}),
    "eva w=32 c=8 proposal=query": ("eva", {"window": 32, "chunk_size": 8}),
    "eva w=32 c=8 proposal=key": ("eva", {"window": 32, "chunk_size": 8, "proposal": "key"}),
    "scatterbrain sliding w=32 m=64": ("scatterbrain", {"window": 32, "features": 64, "mode": "sliding"}),
    "scatterbrain block w=32 m=64": ("scatterbrain", {"window": 32, "features": 64}),
    "performer m=64": ("performer", {"features": 64}),
    "linear elu": ("linear", {}),
    "cosformer": ("cosformer", {}),
}


def run_row(label: str, row: dict, args: argparse.Namespace) -> dict:
    """Zero-shot perplexity (unless ``row`` has it), then, with ``--steps``, the fine-tuned one."""
    torch.manual_seed(0)
    task = get_task("lm", max_length=args.max_length, max_tokens=args.eval_tokens,
                    data=None if args.data is None else str(args.data))
    model, tokenizer = load_model("smollm2-135m", task=task, device=args.device)
    name, mech_args = ROWS[label]
    if name is not None:
        apply(model, name, **mech_args)
    row.update({"mechanism": name or "softmax", "args": mech_args})
    if "zero_shot" not in row:
        row["zero_shot"] = task.evaluate(model, tokenizer, progress=False)["perplexity"]
        print(f"{label}: zero-shot perplexity {row['zero_shot']:.2f}", flush=True)
    if args.steps:
        start = time.time()
        finetune(model, tokenizer, task, max_steps=args.steps, batch_size=args.batch_size, learning_rate=args.lr,
                 seed=0, progress=True, logging_steps=max(1, args.steps // 4))
        row.update({"finetuned": task.evaluate(model, tokenizer, progress=False)["perplexity"],
                    "steps": args.steps, "finetune_seconds": round(time.time() - start, 1)})
        print(f"{label}: fine-tuned perplexity {row['finetuned']:.2f}", flush=True)
    return row


def table(results: dict) -> str:
    setup = results.get("setup", {})
    lines = [f"SmolLM2-135M, mechanism at all 30 sites; WikiText-2 perplexity on {setup.get('eval_tokens')} "
             f"evaluation tokens in {setup.get('max_length')}-token windows; fine-tuned: updates of "
             f"{setup.get('batch_size')} window(s), lr {setup.get('lr')}", "",
             "| attention | zero-shot | fine-tuned | updates |", "|---|---|---|---|"]
    for label in ROWS:
        row = results.get("rows", {}).get(label)
        if row:
            tuned = f"{row['finetuned']:.1f}" if "finetuned" in row else "–"
            lines.append(f"| {label} | {row['zero_shot']:.1f} | {tuned} | {row.get('steps', '–')} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", nargs="*", help="row labels to run (see --list)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--eval-tokens", type=int, default=4096)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--all", action="store_true", help="run every row")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--force", action="store_true", help="re-run rows already in --out")
    common.add_data(parser, common.WIKITEXT, "the lm task's text file")
    common.add_device(parser)
    args = parser.parse_args()
    if args.list:
        print("\n".join(ROWS))
        return
    args.rows = list(ROWS) if args.all else args.rows
    results = common.load_results(args.out)
    setup = {k: getattr(args, k) for k in ("batch_size", "lr", "max_length", "eval_tokens")}
    if args.rows and results.get("setup", setup) != setup:
        parser.error(f"{args.out} was measured with {results['setup']}; use the same settings or another --out")
    unknown = [r for r in args.rows if r not in ROWS]
    if unknown:
        parser.error(f"unknown row(s) {unknown}; see --list")
    results.update({"script": "experiments/mechanisms_lm.py", "setup": setup, "torch": torch.__version__})
    rows = results.setdefault("rows", {})
    for label in args.rows:
        row = {} if args.force else rows.get(label, {})
        if "zero_shot" in row and (not args.steps or row.get("steps") == args.steps):
            print(f"{label}: already measured ({row})")
            continue
        row.pop("finetuned", None)
        row = run_row(label, row, args)
        # rows another invocation finished meanwhile are kept
        rows.update({k: v for k, v in common.load_results(args.out, {"rows": {}})["rows"].items()
                     if k not in args.rows})
        rows[label] = row
        common.save_results(args.out, results)
    print(table(results))


if __name__ == "__main__":
    main()
