"""``--recover distill|finetune|none`` and its options, shared by the verbs that edit a model (prune, compress,
replace): the teacher is chosen before the edit, recovery runs after it, and the verb records what ran. After a
reversible edit (ops attached: ``replace``) the teacher is the model itself with its ops switched off (no copy);
after one that rewrites weights (``prune``, ``compress``) it is a copy taken before the edit."""

from __future__ import annotations

import argparse
import copy
from typing import Any

from ..errors import HeadwiseError
from .constants import TRAIN_MEMORY_MODES as MEMORY_MODES
from .options import add

OFF, COPY, CACHED = "off", "copy", "cached"  # --teacher values that name no model (headwise.tasks.recovery.OFF)


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
    """``--train-memory keep|bounded|auto`` (``headwise.trainer.memory``), for every verb that trains."""
    parser.add_argument("--train-memory", choices=MEMORY_MODES, default="keep",
                        help="keep (default): activations and gradients kept for the step; bounded: blocks recomputed "
                             "in the backward and each weight updated as soon as its gradient is complete (no "
                             "gradients held together, no global-norm clipping: about the weights + optimizer "
                             "state); auto: bounded when gradients and optimizer state would not fit in half the "
                             "free memory")


def recovery_mode(args: argparse.Namespace) -> str:
    """The recovery mode the options ask for, checked (before any model loads)."""
    from ..tasks.recovery import check_recovery

    if args.finetune < 0:
        raise HeadwiseError(f"--finetune {args.finetune:g} must be ≥ 0")
    if args.finetune and args.recover not in (None, "finetune"):
        raise HeadwiseError(f"--finetune is shorthand for --recover finetune; drop it or --recover {args.recover}")
    mode = "finetune" if args.finetune else args.recover or "none"
    epochs = args.finetune or args.recover_epochs
    if args.teacher and mode != "distill":
        raise HeadwiseError("--teacher applies to --recover distill")
    check_recovery(mode, epochs, args.recover_steps, args.alpha, args.temperature, args.distance)
    return mode


def teacher_for(args: argparse.Namespace, model: Any, tokenizer: Any, task: Any, reversible: bool = False) -> Any:
    """The teacher of ``--recover distill``, chosen before the edit: ``"off"`` (the student with its ops
    switched off; the default when the verb's edit is ``reversible``), the unedited model's outputs on the
    recovery windows (``--teacher cached``; the default otherwise on the ``lm`` task), a copy of ``model``
    (``--teacher copy``; the default otherwise) or the model ``--teacher`` names."""
    if recovery_mode(args) != "distill":
        return None
    choice = args.teacher or (OFF if reversible else CACHED if task.name == "lm" else COPY)
    if choice == CACHED:  # with --recover-steps only the windows those steps can reach are recorded (and trained on)
        from ..tasks import CachedTeacher

        return CachedTeacher.record(model, tokenizer, task, max_steps=args.recover_steps)
    if choice == OFF:
        if not reversible:
            raise HeadwiseError(f"--teacher off needs a reversible edit (ops attached); {args.verb} rewrites weights: "
                                "use --teacher copy or a model name")
        return OFF
    if choice == COPY:
        return copy.deepcopy(model)
    from ..models import load_model

    teacher, _ = load_model(args.teacher, args.device, args.dtype, with_tokenizer=False, task=task)
    return teacher


def recover_after_edit(args: argparse.Namespace, model: Any, tokenizer: Any, task: Any, teacher: Any) -> dict:
    """Run the recovery the options ask for on the edited ``model``; returns what ran (for the verb's JSON)."""
    from ..tasks.recovery import recover

    mode = recovery_mode(args)
    if mode == "none":
        return {"mode": mode}
    epochs = args.finetune or args.recover_epochs
    from ..tasks import CachedTeacher

    cached = isinstance(teacher, CachedTeacher)
    recover(model, tokenizer, task, teacher=teacher, mode=mode, epochs=epochs, max_steps=args.recover_steps,
            alpha=args.alpha, temperature=args.temperature, distance=args.distance,
            limit=teacher.limit if cached else None, memory=args.train_memory)
    done = {"mode": mode, "epochs": epochs, "steps": args.recover_steps, "train_memory": args.train_memory}
    if mode == "distill":
        named = args.teacher not in (None, OFF, COPY, CACHED)
        done |= {"teacher": args.teacher if named else "the model with its headwise ops switched off"
                 if isinstance(teacher, str) else "the outputs of the model before the edit (cached)"
                 if cached else "a copy of the model before the edit",
                 "alpha": args.alpha,
                 "temperature": args.temperature, "distance": args.distance}
    return done
