"""``headwise train translation``: a tokenizer and a Marian model trained from scratch on a parallel corpus
(the shared Multi30k model's recipe), resumable, with a cached result."""

from __future__ import annotations

import argparse

from ..errors import HeadwiseError
from .options import add, output_args
from .output import print_json
from .suggest import suggest

# flag → (recipe field, type, help); type None: a shared option (options.SHARED)
RECIPE_FLAGS = {
    "--minutes": ("minutes", float, "wall-clock budget in minutes, evaluations included (default 90)"),
    "--epochs": ("epochs", None, None),
    "--max-steps": ("max_steps", None, None),
    "--vocab-size": ("vocab_size", int, "BPE vocabulary shared by both languages (default 8000)"),
    "--d-model": ("d_model", int, "model width (default 256)"),
    "--num-layers": ("layers", int, "encoder and decoder layers (default 3)"),
    "--num-heads": ("heads", int, "attention heads per module (default 8)"),
    "--ffn": ("ffn", int, "feed-forward width (default 1024)"),
    "--lr": ("learning_rate", None, None),
    "--warmup": ("warmup", int, "linear warm-up steps before inverse square-root decay (default 800)"),
    "--batch-tokens": ("max_tokens", int, "padded source-or-target tokens per batch (default 4096)"),
    "--val-size": ("val_size", int, "validation pairs for greedy BLEU (default 500)"),
    "--eval-every": ("eval_every", int, "evaluate every N steps (default: every epoch)"),
    "--seed": ("seed", None, None),
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


# what each page of this verb shows under "examples:" (tests/test_cli_help.py parses every line)
EXAMPLES: dict[str, tuple[str, ...]] = {
    "train": ("headwise train translation --data-dir multi30k/data/task1/raw --out my-marian",),
    "train translation": ("headwise train translation --data-dir multi30k/data/task1/raw --out my-marian",
                          "headwise train translation --out my-marian --resume   # continue an unfinished run"),
}


def register(verbs: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    train = verbs.add_parser("train", parents=parents, help="train a model from scratch (translation: a Marian model)")
    tasks = train.add_subparsers(dest="task", required=True, metavar="TASK")
    p = tasks.add_parser("translation", parents=parents,
                         help="tokenizer + Marian encoder-decoder from scratch on a parallel corpus")
    add(p, "--data-dir", default=None)
    add(p, "--src", default="de")
    add(p, "--tgt", default="en")
    p.add_argument("--train-split", default="train", help="training split (default: train)")
    p.add_argument("--val-split", default="val", help="split for model selection (default: val)")
    add(p, "--max-length", default=128)
    output_args(p, None, "the model, its tokenizer, the checkpoint and the result")
    g = p.add_argument_group("training (default: the recipe's)")
    for flag, (_, kind, text) in RECIPE_FLAGS.items():
        if kind is None:
            add(g, flag, default=None)
        else:
            g.add_argument(flag, type=kind, default=None, help=text)
    g.add_argument("--no-time-limit", action="store_true", help="no --minutes budget (give --epochs/--max-steps)")
    add(p, "--device", default="cpu")
    add(g, "--resume")
    p.set_defaults(run=cmd_train_translation)
