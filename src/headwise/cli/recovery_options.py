"""``--recover distill|finetune|none`` and its options, shared by the verbs that edit a model (prune, compress,
replace): they make one ``workflows.Recovery`` (``recovery_of``), which chooses the teacher before the edit and
runs the recovery after it."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import HeadwiseError
from .constants import TRAIN_MEMORY_MODES as MEMORY_MODES
from .options import add

def recovery_args(parser: argparse.ArgumentParser) -> None:
    """The recovery group of the verbs that edit a model."""
    g = parser.add_argument_group("recovery after the edit")
    add(g, "--recover", default=None, shown="none")
    add(g, "--recover-epochs", default=1.0)
    add(g, "--recover-steps", default=-1)
    g.add_argument("--finetune", type=float, default=0.0, metavar="EPOCHS",
                   help="shorthand for --recover finetune --recover-epochs EPOCHS")
    g.add_argument("--teacher", default=None,
                   help="distill: the model to distil from: a model name or folder; 'copy' (a copy of the model as "
                        "loaded, taken before the edit: twice the weights in memory); 'off' (the edited model with "
                        "its headwise ops switched off: no copy, reversible edits only); 'cached' (the unedited "
                        "model's last hidden states on the recovery windows and a copy of its output head: causal "
                        "LMs on --task lm). Default: 'off' after a reversible edit (replace); after one that "
                        "rewrites weights (prune, compress) 'cached' on --task lm, else 'copy'")
    g.add_argument("--alpha", type=float, default=0.5,
                   help="distill: weight of the distillation loss, 0-1 (default: 0.5; the task loss gets 1 - alpha)")
    g.add_argument("--temperature", type=float, default=2.0, help="distill: softening of logits (default: 2)")
    g.add_argument("--distance", choices=("mse", "cosine"), default="mse",
                   help="distill: distance between embeddings (stsb, regression; default: mse)")
    train_memory_arg(g)


def train_memory_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--train-memory keep|bounded|auto`` (``headwise.training.memory``), for every verb that trains."""
    parser.add_argument("--train-memory", choices=MEMORY_MODES, default="keep",
                        help="keep (default): activations and gradients kept for the step; bounded: blocks recomputed "
                             "in the backward and each weight updated as soon as its gradient is complete (no "
                             "gradients held together, no global-norm clipping: about the weights + optimizer "
                             "state); auto: bounded when gradients and optimizer state would not fit in half the "
                             "free memory")


def recovery_of(args: argparse.Namespace):
    """The ``workflows.Recovery`` the options ask for, checked (before any model loads)."""
    from ..training.recovery import Recovery

    if args.finetune < 0:
        raise HeadwiseError(f"--finetune {args.finetune:g} must be ≥ 0")
    if args.finetune and args.recover not in (None, "finetune"):
        raise HeadwiseError(f"--finetune is shorthand for --recover finetune; drop it or --recover {args.recover}")
    mode = "finetune" if args.finetune else args.recover or "none"
    if args.teacher and mode != "distill":
        raise HeadwiseError("--teacher applies to --recover distill")
    return Recovery(mode=mode, epochs=args.finetune or args.recover_epochs, steps=args.recover_steps,
                    alpha=args.alpha, temperature=args.temperature, distance=args.distance, memory=args.train_memory,
                    teacher=args.teacher)


def recovery_mode(args: argparse.Namespace) -> str:
    """The recovery mode the options ask for, checked (before any model loads)."""
    return recovery_of(args).mode


def refuse_teacher_off(args: argparse.Namespace, reversible: bool = False) -> None:
    """``--teacher off`` distils from the edited model with its ops switched off: refused for a verb whose edit
    rewrites weights, in one line naming the option."""
    if args.teacher == "off" and not reversible and recovery_mode(args) == "distill":
        raise HeadwiseError(f"--teacher off needs a reversible edit (ops attached); {args.verb} rewrites weights: "
                            "use --teacher copy or a model name")


def teacher_for(args: argparse.Namespace, model: Any, tokenizer: Any, task: Any, reversible: bool = False) -> Any:
    """The teacher of ``--recover distill``, chosen before the edit (``workflows.Recovery.teacher_for``)."""
    refuse_teacher_off(args, reversible)
    return recovery_of(args).teacher_for(model, tokenizer, task, reversible=reversible, device=args.device,
                                         dtype=args.dtype)


def recover_after_edit(args: argparse.Namespace, model: Any, tokenizer: Any, task: Any, teacher: Any) -> dict:
    """Run the recovery the options ask for on the edited ``model``; returns what ran (for the verb's JSON)."""
    return recovery_of(args).run(model, tokenizer, task, teacher)
