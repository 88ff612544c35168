"""The commands the CLI suggests (the analysis report's ``headwise plan``, plan.json's ``headwise apply``, train's
``headwise eval``), built from the parsed arguments of the run that suggests them, so that they run as printed: the
model and how it is loaded, the task and its data (split, lengths, columns, and ``--limit``: a run on the first N
examples suggests a run on the same ones). ``--batch-size`` and the verbs' own options are not carried."""

from __future__ import annotations

import argparse
import shlex

# how the model is loaded (model_args), then the task and the task options of task_options.OPTIONS that say what the
# data is (--limit: one meaning in every verb, the first N examples); `--device cpu` is every default, left out
LOADING = ("model", "device", "dtype", "device_map", "max_memory", "offload_folder")
TASK = ("task", "data", "split", "max_length", "stride", "max_tokens", "data_dir", "src", "tgt", "src_file",
        "tgt_file", "text_column", "pair_column", "label_column", "limit")


def run_options(args: argparse.Namespace, carry: tuple[str, ...] = LOADING + TASK) -> list[str]:
    """``--flag value`` for each option in ``carry`` the run was given (None, False and ``--device cpu`` left
    out), in ``carry``'s order."""
    out: list[str] = []
    for dest in carry:
        value = getattr(args, dest, None)
        if value is None or value is False or (dest == "device" and value == "cpu"):
            continue
        out += [f"--{dest.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return out


def suggest(argv: list[str], args: argparse.Namespace, carry: tuple[str, ...] = LOADING + TASK) -> str:
    """``headwise ARGV`` followed by the options of this run that matter to it (``run_options``), shell-quoted."""
    return shlex.join(["headwise", *argv, *run_options(args, carry)])
