"""``headwise train translation``: a tokenizer and a Marian model trained from scratch on a parallel corpus
(the shared Multi30k model's recipe), resumable, with a cached result."""

from __future__ import annotations

import argparse

from ..errors import HeadwiseError
from .output import print_json
from .suggest import suggest

# flag → (recipe field, type, help)
RECIPE_FLAGS = {
    "--minutes": ("minutes", float, "wall-clock budget in minutes, evaluations included (default 90)"),
    "--epochs": ("epochs", int, "stop after this many epochs"),
    "--max-steps": ("max_steps", int, "stop after this many updates"),
    "--vocab-size": ("vocab_size", int, "BPE vocabulary shared by both languages (default 8000)"),
    "--d-model": ("d_model", int, "model width (default 256)"),
    "--num-layers": ("layers", int, "encoder and decoder layers (default 3)"),
    "--num-heads": ("heads", int, "attention heads per module (default 8)"),
    "--ffn": ("ffn", int, "feed-forward width (default 1024)"),
    "--lr": ("learning_rate", float, "peak learning rate (default 1e-3)"),
    "--warmup": ("warmup", int, "linear warm-up steps before inverse square-root decay (default 800)"),
    "--batch-tokens": ("max_tokens", int, "padded source-or-target tokens per batch (default 4096)"),
    "--val-size": ("val_size", int, "validation pairs for greedy BLEU (default 500)"),
    "--eval-every": ("eval_every", int, "evaluate every N steps (default: every epoch)"),
    "--seed": ("seed", int, "seed of initialisation, batches and dropout (default 1)"),
}


def cmd_train_translation(args: argparse.Namespace) -> int:
    from ..tasks.translation import Translation
    from ..training.translation_model import TranslationRecipe, train_translation_model

    options = {field: getattr(args, flag[2:].replace("-", "_")) for flag, (field, _, _) in RECIPE_FLAGS.items()}
    options = {k: v for k, v in options.items() if v is not None}
    if args.no_time_limit:
        options["minutes"] = None
    if args.max_length < 2:
        raise HeadwiseError(f"--max-length {args.max_length}: give at least 2 tokens")
    recipe = TranslationRecipe(**options)
    task = Translation(data_dir=args.data_dir, src=args.src, tgt=args.tgt, train_split=args.train_split,
                       max_length=args.max_length)
    result = train_translation_model(args.out, task, recipe, val_split=args.val_split, resume=args.resume,
                                     force=args.force, device=args.device, progress=not args.json)
    if args.json:
        print_json(result, indent=2)
    else:
        print(f"{args.out}: {result['steps']} steps ({result['epochs']:.2f} epochs, {result['minutes']:.1f} min); "
              f"best greedy val BLEU {result['best_val_bleu']:.2f} at step {result['best_step']} "
              f"({result['val_pairs']} pairs)")
        print("evaluate: " + suggest(["eval", "translation", "--model", args.out, "--data-dir",
                                      str(result["data"]["data_dir"]), "--src", args.src, "--tgt", args.tgt, "--beam",
                                      "4"], args, ("device",)))
    return 0


def register(verbs: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    train = verbs.add_parser("train", parents=parents, help="train a model from scratch (translation: a Marian model)")
    tasks = train.add_subparsers(dest="task", required=True, metavar="TASK")
    p = tasks.add_parser("translation", parents=parents,
                         help="tokenizer + Marian encoder-decoder from scratch on a parallel corpus")
    p.add_argument("--data-dir", default=None,
                   help="folder of {split}.{lang}[.gz] files (default: shared/data/multi30k)")
    p.add_argument("--src", default="de", help="source language suffix (default: de)")
    p.add_argument("--tgt", default="en", help="target language suffix (default: en)")
    p.add_argument("--train-split", default="train", help="training split (default: train)")
    p.add_argument("--val-split", default="val", help="split for model selection (default: val)")
    p.add_argument("--max-length", type=int, default=128, help="tokens kept per sentence (default 128)")
    p.add_argument("--out", required=True, help="output folder: the model, its tokenizer, checkpoint, result")
    for flag, (_, kind, text) in RECIPE_FLAGS.items():
        p.add_argument(flag, type=kind, default=None, help=text)
    p.add_argument("--no-time-limit", action="store_true", help="no --minutes budget (give --epochs/--max-steps)")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu, cuda (default: cpu)")
    p.add_argument("--resume", action="store_true", help="continue the unfinished training in --out")
    p.add_argument("--force", action="store_true", help="delete --out and start over")
    p.set_defaults(run=cmd_train_translation)
