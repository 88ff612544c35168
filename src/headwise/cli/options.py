"""One meaning per flag. ``SHARED`` defines once every option several commands take (one help, one type); ``add``
puts one on a parser with the command's own default. ``config_options`` turns a config's fields into options (their
help is the field's ``metadata["help"]``; a ``Literal`` field gets its choices): ``headwise edit METHOD`` and the
verbs' method options (``quantize --threshold``, ``convert gqa --kv-heads``, ...) come from it, so a flag that a
verb and ``edit`` share is the config field in both. tests/test_cli_flags.py walks every command and keeps one help
and one type per flag.

This module imports nothing heavy: a verb whose options come from a config (which imports torch) adds them with
``Parser.later``, on its first parse or ``--help``.
"""

from __future__ import annotations

import argparse
import collections.abc
import dataclasses
import json
import typing
from pathlib import Path
from typing import Any

from .constants import RECOVERY_MODES


def list_of(kind: type) -> typing.Callable[[str], list]:
    """An argparse ``type``: comma-separated values of ``kind``."""
    def parse(text: str) -> list:
        try:
            return [kind(part.strip()) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__}s, got {text!r}") from None

    parse.__name__ = f"list_of_{kind.__name__}"
    return parse


def json_value(text: str) -> Any:
    """An argparse ``type``: a JSON value, or ``@FILE`` holding one."""
    try:
        return json.loads(Path(text[1:]).read_text(encoding="utf-8") if text.startswith("@") else text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise argparse.ArgumentTypeError(f"expected JSON or @FILE with JSON, got {text!r} ({err})") from None


def int_or_float(text: str) -> int | float:
    """An argparse ``type``: an integer, or else a number (``--dk 192`` or ``--dk 0.25``)."""
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def number_or_text(text: str) -> float | str:
    """An argparse ``type``: a number, or else the text (``--gate-init 3`` or ``--gate-init voita``)."""
    try:
        return float(text)
    except ValueError:
        return text


KINDS = list_of(str)
TASK_NAMES = ("stsb", "lm", "translation", "classification", "long")

# flag → its add_argument keywords (help, type, choices, action, metavar): the one definition of a shared option
SHARED: dict[str, dict[str, Any]] = {
    # model and device
    "--model": {"help": "hub name (org/name), local folder or a named model: minilm, smollm2-135m, "
                        "multi30k-marian-de-en"},
    "--device": {"help": "torch device, e.g. cpu, cuda, cuda:1"},
    "--dtype": {"help": "float32, bfloat16 or float16"},
    "--device-map": {"help": "Accelerate dispatch for models larger than one device: auto, balanced, sequential "
                             "(replaces --device; transformers checkpoints only)"},
    "--max-memory": {"help": "with --device-map: memory per device, e.g. cpu=8GiB or 0=20GiB,cpu=30GiB"},
    "--offload-folder": {"help": "with --device-map: folder for the weights that fit nowhere (disk offload)"},
    "--verify": {"action": "store_true", "help": "check the sha256 of every file of a folder headwise wrote, "
                                                 "whatever its size (by default: sizes always, hashes below 2 GiB)"},
    # task and data
    "--task": {"choices": TASK_NAMES, "help": "the task: what the model is evaluated and trained on, and the head "
                                              "it is loaded with"},
    "--data": {"help": "the task's data: stsb: the .tsv file or folder (analyze: or a .txt file, one text a "
                       "line); lm: a text file, one text a line, or a datasets name (name:config); classification: a "
                       "csv/tsv/jsonl file, a folder, or glue:<task>; translation: see --data-dir; long: a text file, "
                       "the haystack (default: generated)"},
    "--lengths": {"help": "long: prompt lengths in tokens of the model's tokenizer, comma-separated (2k = 2048)"},
    "--samples": {"type": int, "help": "long: samples per task and length"},
    "--split": {"help": "evaluated split (stsb: train, dev, test; lm: eval = last 10%% of lines, train, all; "
                        "translation: test_2016_flickr)"},
    "--max-length": {"type": int, "help": "tokens per window (lm) or per text"},
    "--stride": {"type": int, "help": "lm: tokens between window starts (default: --max-length)"},
    "--max-tokens": {"type": int, "help": "lm: evaluate only the first N tokens"},
    "--data-dir": {"help": "translation: folder of {split}.{lang}[.gz] files (default: shared/data/multi30k)"},
    "--src": {"help": "translation: source language suffix (default: de)"},
    "--tgt": {"help": "translation: target language suffix (default: en)"},
    "--src-file": {"help": "translation: source sentences, one a line (with --tgt-file)"},
    "--tgt-file": {"help": "translation: reference sentences, aligned with --src-file"},
    "--beam": {"type": int, "help": "translation: beams (default 1: greedy)"},
    "--max-new-tokens": {"type": int, "help": "translation: longest output (default 96)"},
    "--text-column": {"help": "classification: text column (default: text)"},
    "--pair-column": {"help": "classification: second-text column (default: pair, if present)"},
    "--label-column": {"help": "classification: label column (default: label)"},
    "--new-head": {"action": "store_true",
                   "help": "classification: start a fresh classification head (the checkpoint has none)"},
    "--limit": {"type": int, "help": "use only the first N examples (texts, pairs or sentences: a quick look)"},
    "--batch-size": {"type": int, "help": "examples per forward pass"},
    "--importance-examples": {"type": int, "help": "training examples for gradient importance (analyze on lm and "
                                                   "stsb: the analysed texts themselves)"},
    "--calibration-limit": {"type": int, "help": "calibration examples used (a seeded random sample of more)"},
    # what is edited
    "--kinds": {"type": KINDS, "metavar": "A,B,...", "help": "only these attention kinds, comma-separated (enc-self, "
                                                            "dec-self, dec-enc; default: every site)"},
    "--layers": {"type": list_of(int), "metavar": "A,B,...", "help": "only these layers, comma-separated (default: "
                                                                     "every layer)"},
    "--names": {"type": KINDS, "metavar": "A,B,...", "help": "only these sites, by name (enc-self.3), comma-separated "
                                                             "(default: every site)"},
    "--kv-budget": {"type": float, "help": "share of today's key/value cache bytes to keep, 0 < b ≤ 1"},
    "--allow-empty-layers": {"action": "store_true", "help": "allow removing every head of a layer (its attention "
                                                             "sublayer then only adds its output bias)"},
    "--no-eval": {"action": "store_true", "help": "skip the evaluations before and after"},
    # training
    "--epochs": {"type": float, "help": "epochs of the verb's training"},
    "--max-steps": {"type": int, "help": "stop the verb's training after N optimizer updates (-1: no limit)"},
    "--lr": {"type": float, "help": "peak learning rate of the verb's training"},
    "--seed": {"type": int, "help": "random seed of what the verb samples (prompts, initialisation, batches)"},
    "--resume": {"action": "store_true", "help": "continue an unfinished run from its last complete checkpoint"},
    "--recover": {"choices": RECOVERY_MODES,
                  "help": "recovery after an edit: distill: fine-tune on the task with distillation from the unedited "
                          "model (or --teacher); finetune: the task loss only; none: keep the edited model as it is"},
    "--recover-epochs": {"type": float, "help": "epochs of recovery after an edit"},
    "--recover-steps": {"type": int, "help": "stop recovery after N optimizer updates (-1: no limit; quick trials)"},
    # output
    "--out": {"help": "output folder"},
    "--force": {"action": "store_true", "help": "replace an existing output folder"},
    "--save-model": {"action": "store_true",
                     "help": "also write OUT/model, the edited model (headwise.from_pretrained reloads it)"},
}

# config fields whose flag is not --FIELD, as their name means something else elsewhere: {Config.field: (flag, old)}
# (the old spelling stays a hidden alias in that config's commands for one release)
FIELD_FLAGS: dict[str, tuple[str, str]] = {
    "GQAConfig.init": ("--gqa-init", "--init"), "LatentConfig.init": ("--latent-init", "--init"),
    "L0Config.init": ("--gate-init", "--init"), "L0Config.temperature": ("--gate-temperature", "--temperature"),
    "QuantizationConfig.method": ("--quantizer", "--method"),
}
GIVEN = frozenset({"default", "required", "dest", "shown"})  # what a command may set on a shared option


def shown_default(default: Any) -> str | None:
    """How --help shows a default (None: nothing to show)."""
    if default is None or default is False or default is argparse.SUPPRESS or default in ({}, [], ()):
        return None
    if isinstance(default, (list, tuple)):
        return ",".join(map(str, default))
    return str(default)


def add(parser: Any, flag: str, **given: Any) -> argparse.Action:
    """Add the shared option ``flag`` (``SHARED``) with this command's ``default`` (and ``required``, ``dest``;
    ``shown``: how --help names a default that is not a plain value, e.g. ``"the checkpoint's"``)."""
    extra = set(given) - GIVEN
    if extra:
        raise TypeError(f"{flag} is a shared option: only {', '.join(sorted(GIVEN))} are the command's, got {extra}")
    shown = given.pop("shown", None)
    action = parser.add_argument(flag, **SHARED[flag], **given)
    action.shown = shown or (None if action.required else shown_default(action.default))
    return action


def output_args(parser: Any, default: str | None, holds: str | None = None) -> None:
    """The output group: ``--out`` (``default``; None: required) and ``--force``; ``holds``: what the verb writes
    there (the group's title)."""
    g = parser.add_argument_group("output" + (f" (OUT holds {holds})" if holds else ""))
    add(g, "--out", **({"default": default} if default else {"required": True}))
    add(g, "--force")


def alias(parser: Any, old: str, new: str, dest: str, **kwargs: Any) -> None:
    """``old``: a hidden spelling of ``new`` that still works, with a one-line notice (``headwise.cli.Alias``)."""
    from . import Alias

    parser.add_argument(old, dest=dest, action=Alias, new=new, help=argparse.SUPPRESS, **kwargs)


def _unwrap(hint: Any) -> Any:
    """``X | None`` → ``X``."""
    if typing.get_origin(hint) is typing.Union or type(hint).__name__ == "UnionType":
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(inner) == 1:
            return inner[0]
        if set(inner) in ({int, float}, {str, float}):
            return inner[0] | inner[1]
    return hint


def _keywords(hint: Any) -> dict[str, Any]:
    """``add_argument`` keywords for a config field of type ``hint``."""
    hint = _unwrap(hint)
    args = typing.get_args(hint)
    if hint is bool:
        return {"action": argparse.BooleanOptionalAction}
    if typing.get_origin(hint) is typing.Literal:
        return {"choices": list(args)}
    if hint in (int, float, str):
        return {"type": hint, "metavar": hint.__name__.upper()}
    if hint == int | float:
        return {"type": int_or_float, "metavar": "NUMBER"}
    if hint == str | float:
        return {"type": number_or_text, "metavar": "NUMBER|TEXT"}
    if typing.get_origin(hint) in (tuple, list, collections.abc.Sequence) and args and args[0] in (int, float, str):
        return {"type": KINDS if args[0] is str else list_of(args[0]), "metavar": "A,B,..."}
    return {"type": json_value, "metavar": "JSON|@FILE"}


def config_options(parser: Any, config: type, names: typing.Iterable[str] | None = None, *,
                   defaults: dict[str, Any] | None = None, keep_defaults: bool = False) -> None:
    """One option per field of ``config`` (``names``: only these, in this order; default: every init field but the
    selection). A shared flag (``SHARED``) keeps its one definition. Without ``keep_defaults`` an option left out
    is absent from the namespace (the config's own default applies; ``headwise edit``); with it the option
    defaults to the field's default, or to ``defaults[name]`` (a verb's own choice)."""
    from ..contract import config_fields  # a method's config is imported by now: so is torch

    fields = {f.name: (f, hint) for f, hint in config_fields(config) if f.name != "selection"}
    for name in (fields if names is None else names):
        f, hint = fields[name]
        missing = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if defaults and name in defaults:
            default = defaults[name]
        flag, old = FIELD_FLAGS.get(f"{config.__name__}.{name}", ("--" + name.replace("_", "-"), None))
        given = {"dest": name, "required": missing,
                 "default": None if missing else default if keep_defaults else argparse.SUPPRESS}
        if flag in SHARED:
            action = add(parser, flag, **given)
        else:
            action = parser.add_argument(flag, help=f.metadata.get("help"), **_keywords(hint), **given)
        action.shown = None if missing else shown_default(default)
        if old:
            kinds = {k: v for k, v in vars(action).items() if k in ("type", "choices")}
            alias(parser, old, flag, name, default=argparse.SUPPRESS, **kinds)
    for name, home in getattr(config, "MOVED", {}).items():  # how the method trains: not what is attached
        parser.add_argument("--" + name.replace("_", "-"), dest=name, action=Moved, home=home,
                            default=argparse.SUPPRESS, help=argparse.SUPPRESS)


class Moved(argparse.Action):
    """A field that moved out of a config (``MOVED``): refused in one line naming where it went."""

    def __init__(self, option_strings: list[str], dest: str, home: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.home = home

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        parser.error(f"{option_string} sets how the method trains ({self.home}), not what edit attaches; train "
                     "with headwise prune --method l0 or headwise mix --mix-epochs")
