"""``headwise <verb>``: the command line. Errors print one line (a traceback only with --debug) and exit with 2.

Each verb lives in ``headwise.cli.<verb>`` with ``register(verbs, parents)``; this module builds the parser and runs
the chosen verb. Building the parser imports neither torch nor transformers (``headwise --help`` answers at once;
tests/test_cli_help.py checks it): each verb imports its heavy code inside its run function, and every method package
is imported (``headwise.contract.load_methods``) only once a verb is about to run. Shared options and the options
generated from config fields come from ``headwise.cli.options`` (one meaning per flag); a verb whose options are a
config's fields adds them with ``Parser.later``, on its first parse or --help (that page imports the config).

Every number option of every verb is checked while parsing, before any work: a finite value, above 0 for the counts
and sizes in ``POSITIVE``, not negative where the default is a number ≥ 0 (``--max-steps -1`` keeps its meaning);
``--device`` must name a device this build of torch has and ``--dtype`` a known dtype.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import math
import os
import sys
import warnings
from typing import Any, Callable

from ..errors import HeadwiseError

Command = Callable[[argparse.Namespace], int]

# The verbs, in help order: each module has ``register(verbs, parents)`` and imports heavy code lazily.
PLUGINS: tuple[str, ...] = ("headwise.cli.sites", "headwise.cli.analyze", "headwise.cli.eval", "headwise.cli.prune",
                           "headwise.cli.quantize", "headwise.cli.mechanisms", "headwise.cli.compress", "headwise.cli.mix",
                           "headwise.cli.replace", "headwise.cli.kv_policy",
                           "headwise.cli.convert", "headwise.cli.train", "headwise.cli.plan",
                           "headwise.cli.apply", "headwise.cli.edit", "headwise.cli.methods")


def examples() -> dict[str, tuple[str, ...]]:
    """What each page shows under "examples:", keyed by the page (``"convert gqa"``): the ``EXAMPLES`` of every
    verb module (tests/test_cli_help.py parses every line; the tour of docs/quickstart.md runs most of them).
    ``headwise edit`` and ``edit METHOD`` show the examples of the methods' declarations."""
    out: dict[str, tuple[str, ...]] = {}
    for plugin in PLUGINS:
        out |= getattr(importlib.import_module(plugin), "EXAMPLES", {})
    return out


def __getattr__(name: str) -> Any:
    if name == "EXAMPLES":  # every page's examples, read from the verb modules (examples())
        return examples()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


START = """start here (docs/quickstart.md is a five-minute tour):
  headwise sites                                   # the attention sites of the default model (all-MiniLM-L6-v2)
  headwise eval stsb --limit 500                   # its STS-B score
  headwise plan --budget heads=0.75 --out plan     # edits that keep 75% of the heads, measured
  headwise apply plan/plan.json --out applied      # the recommended one, saved to applied/model
  headwise VERB --help                             # a verb's options and examples"""


# the verbs' number options (by destination) that count, size or scale something: they must be > 0 (0 is as wrong
# as -1); a method config's field says so itself (metadata "positive", headwise.flags)
POSITIVE = frozenset({
    "limit", "batch_size", "max_length", "stride", "max_tokens", "beam", "max_new_tokens", "keep", "step",
    "importance_examples", "ablation_texts", "calibration", "top_k", "repeats", "calib_tokens", "window", "context",
    "gate_steps", "gate_length", "eval_length", "calibration_length", "epochs", "recover_epochs", "lr", "kv_budget",
    "temperature", "gate_lr", "d_model", "layers", "heads", "ffn", "minutes", "vocab_size", "val_size", "eval_every", "samples",
})


def number(kind: type, positive: bool, negative_allowed: bool = False) -> Callable[[str], Any]:
    """An argparse ``type`` that parses ``kind`` (int or float) and refuses non-finite values, values ≤ 0 when
    ``positive`` and negative values unless ``negative_allowed``."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") \
                from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if positive and value <= 0:
            raise argparse.ArgumentTypeError(f"{text} is out of range; give a number above 0")
        if not negative_allowed and value < 0:
            raise argparse.ArgumentTypeError(f"{text} is out of range; give 0 or more")
        return value

    parse.__name__ = kind.__name__
    parse.positive = positive  # type: ignore[attr-defined]  # what a caller may read back (tests/test_cli_fuzz.py)
    return parse


def device(text: str) -> str:
    """An argparse ``type``: a torch device this build has (``headwise.models.check_device``)."""
    from ..models import check_device

    try:
        check_device(text)
    except HeadwiseError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def dtype(text: str) -> str:
    """An argparse ``type``: a dtype name ``headwise.models.parse_dtype`` knows."""
    from ..models import DTYPES

    if text not in DTYPES:
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r}; use one of {', '.join(DTYPES)}")
    return text


def checked(names: tuple[str, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``add_argument`` keywords with the checking ``type`` for numbers (above 0 for ``POSITIVE`` destinations and
    for ``positive=True``, which config fields pass, ``headwise.flags.option``), ``--device`` and ``--dtype``."""
    dest = kwargs.get("dest") or next((n[2:] for n in names if n.startswith("--")), names[0]).replace("-", "_")
    positive = kwargs.pop("positive", False) or dest in POSITIVE
    kind = kwargs.get("type")
    if kind in (int, float):
        default = kwargs.get("default")
        counted = isinstance(default, (int, float)) and not isinstance(default, bool) and default >= 0
        kwargs["type"] = number(kind, positive=positive, negative_allowed=not counted)
    elif kind is None and dest in ("device", "dtype"):
        kwargs["type"] = device if dest == "device" else dtype
    return kwargs


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and examples as written; an option's default (``action.shown``, set by ``options.add``)
    after its help: one help text per flag, each command's own default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        shown = getattr(action, "shown", None)
        text = action.help or ""
        return text if shown is None else f"{text} (default: {shown.replace('%', '%%')})"


class Parser(argparse.ArgumentParser):
    """``argparse`` with one-line errors (``headwise: error: …``, exit 2), checked numbers and devices (in
    argument groups too), and options added ``later`` (those generated from a config, which imports torch: built
    on the command's first parse or --help, so that building the parser stays light)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.pending: list[Callable[[argparse.ArgumentParser], None]] = []

    def later(self, build: Callable[[argparse.ArgumentParser], None]) -> None:
        """Add options with ``build(parser)`` on the command's first parse or --help."""
        self.pending.append(build)

    def complete(self) -> "Parser":
        """Add the options left for ``later``; returns the parser."""
        while self.pending:
            self.pending.pop(0)(self)
        return self

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self.complete()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self.complete()
        return super().format_help()

    def add_argument(self, *names: Any, **kwargs: Any) -> argparse.Action:
        return super().add_argument(*names, **checked(names, kwargs))

    def add_argument_group(self, *args: Any, **kwargs: Any) -> Any:
        group = super().add_argument_group(*args, **kwargs)
        plain = group.add_argument
        group.add_argument = lambda *names, **kw: plain(*names, **checked(names, kw))  # type: ignore[method-assign]
        return group

    def error(self, message: str) -> None:  # type: ignore[override]
        where = self.prog.removeprefix("headwise").strip()
        self.exit(2, f"headwise: error: {where + ': ' if where else ''}{message}\n")


class Alias(argparse.Action):
    """A hidden old spelling of an option (``add_argument("--text", dest="data", action=Alias, new="--data",
    help=argparse.SUPPRESS)``): it still works, into the new option's destination, with a one-line notice."""

    def __init__(self, option_strings: list[str], dest: str, new: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"headwise: {option_string} is now {self.new} (same meaning); {option_string} still works",
              file=sys.stderr)
        setattr(namespace, self.dest, values)


def model_args(parser: argparse.ArgumentParser, default: str | None = None, dtype: str = "the checkpoint's") -> None:
    """The model and device group: ``--model`` (``default``: None is the packaged minilm), ``--device``,
    ``--dtype`` (``dtype``: what its default means), Accelerate's dispatch options (every verb that loads a model
    passes them to ``load_model``: ``task_options.dispatch_of``) and ``--verify``."""
    from .options import add

    g = parser.add_argument_group("model and device")
    add(g, "--model", default=default, shown=default or "minilm")
    add(g, "--device", default="cpu")
    add(g, "--dtype", default=None, shown=dtype)
    for flag in ("--device-map", "--max-memory", "--offload-folder", "--verify"):
        add(g, flag, default=None)


def global_flags(parser: argparse.ArgumentParser, default: object) -> None:
    """``--debug`` and ``--json``, taken before the verb or after it: the verbs' copies default to SUPPRESS so
    that a flag given before the verb is not reset by the verb's own default."""
    parser.add_argument("--debug", action="store_true", default=default, help="show tracebacks")
    parser.add_argument("--json", action="store_true", default=default, help="print machine-readable JSON")


def build_parser() -> argparse.ArgumentParser:
    common = Parser(add_help=False)
    global_flags(common, argparse.SUPPRESS)
    parser = Parser(prog="headwise", description="Find, measure and edit the attention heads of transformers models.",
                    epilog=START)
    global_flags(parser, False)
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    for plugin in PLUGINS:
        importlib.import_module(plugin).register(verbs, [common])
    describe(verbs)
    return parser


def describe(commands: argparse._SubParsersAction, path: str = "", pages: dict | None = None) -> None:
    """Each command's --help (verbs and their sub-commands, ``eval lm``, ``convert gqa``): its one line on top,
    examples (``examples()``) below."""
    pages = examples() if pages is None else pages
    summaries = {action.dest: action.help for action in commands._choices_actions}
    for name in list(commands.choices):
        if path == "edit":  # its method pages build their options lazily (cli.edit.MethodParsers)
            continue
        command, key = commands.choices[name], f"{path} {name}".strip()
        command.description = command.description or summaries.get(name)
        if key in pages:
            command.epilog = "examples:\n" + "\n".join(f"  {line}" for line in pages[key])
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                describe(action, key, pages)


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


def _notice(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None,
            line: str | None = None) -> None:
    """How a run shows headwise's own ``FutureWarning`` (a former name or keyword that still works) and its
    ``HeadwiseNote`` (a fallback taken): one line, ``headwise: note: ...``; any other warning as Python shows it."""
    from ..errors import HeadwiseNote

    if issubclass(category, HeadwiseNote) or (issubclass(category, FutureWarning)
                                              and f"{os.sep}headwise{os.sep}" in filename):
        print(f"headwise: note: {message}", file=sys.stderr)
    else:
        _PYTHON_SHOWWARNING(message, category, filename, lineno, file, line)


_PYTHON_SHOWWARNING = warnings.showwarning


def main(argv: list[str] | None = None) -> int:
    """Run ``headwise ARGV``; returns the exit status (2 for any refused input, parse errors included)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # argparse: --help (0) or a bad argument (2, its one line already printed)
        return exit_.code if isinstance(exit_.code, int) else 2
    from ..contract import load_methods

    load_methods()  # every method registered before a verb reads a checkpoint (import headwise alone is light)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # headwise shows its own progress for long work
    from ..io.files import release_all_outputs

    try:
        status = _run(args)
    finally:
        interrupted = release_all_outputs()  # a SIGINT meanwhile waits for the claims to go
    if interrupted and status != 130:
        print("headwise: interrupted", file=sys.stderr)
        return 130
    return status


def _run(args: argparse.Namespace) -> int:
    """Run the chosen verb; a refused input or an interrupt is one line and an exit status."""
    try:
        from ..allocator import ENV, return_freed_memory

        # $HEADWISE_MMAP_THRESHOLD: freed large tensors go back to the system (opt-in; glibc only)
        if not return_freed_memory() and os.environ.get(ENV, "0").strip() not in ("", "0"):
            print(f"headwise: ${ENV} is set but has no effect here (it sets glibc's malloc, and this system's C "
                  "library is not glibc)", file=sys.stderr)
        with warnings.catch_warnings():
            warnings.simplefilter("always", FutureWarning)  # a former name is said every time, in one line
            warnings.showwarning = _notice
            return _run_json(args) if args.json else args.run(args)
    except HeadwiseError as err:
        if args.debug:
            raise
        print(f"headwise: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("headwise: interrupted", file=sys.stderr)
        return 130

