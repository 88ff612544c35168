"""``headwise <verb>``: the command line. Errors print one line (a traceback only with --debug).

Each verb lives in ``headwise.cli.<verb>`` with ``register(verbs, parents)``; this module builds the parser and runs
the chosen verb.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import sys
from typing import Callable

from ..errors import HeadwiseError

Command = Callable[[argparse.Namespace], int]

# The verbs, in help order: each module has ``register(verbs, parents)`` and imports heavy code lazily.
PLUGINS: tuple[str, ...] = ("headwise.cli.sites", "headwise.cli.analyze", "headwise.cli.eval", "headwise.cli.prune",
                           "headwise.cli.quantize", "headwise.cli.mechanisms", "headwise.cli.compress", "headwise.cli.mix",
                           "headwise.cli.replace", "headwise.cli.kv_policy",
                           "headwise.cli.convert", "headwise.cli.train", "headwise.cli.plan",
                           "headwise.cli.apply")


def model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None,
                        help="hub name or local folder (default: the packaged all-MiniLM-L6-v2)")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu, cuda, cuda:1 (default: cpu)")
    parser.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: the checkpoint's)")


def global_flags(parser: argparse.ArgumentParser, default: object) -> None:
    """``--debug`` and ``--json``, taken before the verb or after it: the verbs' copies default to SUPPRESS so
    that a flag given before the verb is not reset by the verb's own default."""
    parser.add_argument("--debug", action="store_true", default=default, help="show tracebacks")
    parser.add_argument("--json", action="store_true", default=default, help="print machine-readable JSON")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    global_flags(common, argparse.SUPPRESS)
    parser = argparse.ArgumentParser(prog="headwise",
                                     description="Find, measure and edit the attention heads of transformers models.")
    global_flags(parser, False)
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    for plugin in PLUGINS:
        importlib.import_module(plugin).register(verbs, [common])
    return parser


def _json_start(text: str) -> int:
    """Offset of the first line from which the rest of ``text`` is one JSON document (``len(text)`` if none)."""
    offset = 0
    for line in text.splitlines(keepends=True):
        try:
            json.loads(text[offset:])
            return offset
        except json.JSONDecodeError:
            offset += len(line)
    return len(text)


def _run_json(args: argparse.Namespace) -> int:
    """Run a verb under ``--json``: stdout carries only the JSON document the verb prints last; whatever the
    libraries print before it (the Trainer's loss lines, tqdm.write) goes to stderr."""
    held = io.StringIO()
    try:
        with contextlib.redirect_stdout(held):
            return args.run(args)
    finally:
        text = held.getvalue()
        start = _json_start(text)
        sys.stderr.write(text[:start])
        sys.stdout.write(text[start:])
        sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # headwise shows its own progress for long work
    try:
        return _run_json(args) if args.json else args.run(args)
    except HeadwiseError as err:
        if args.debug:
            raise
        print(f"headwise: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("headwise: interrupted", file=sys.stderr)
        return 130

