"""One meaning per flag. ``SHARED`` defines once every option several commands take (one help, one type); ``add``
puts one on a parser with the command's own default. ``config_options`` turns a config's fields into options through
the one field-to-flag converter (``headwise.flags``: the field's ``metadata`` gives its help, its flag when
``--FIELD`` means something else elsewhere, a hidden former spelling, whether it must be positive; a ``Literal``
gives choices): ``headwise edit METHOD`` and the verbs' method options (``quantize --threshold``, ``convert gqa
--kv-heads``, ...) come from it, so a flag that a verb and ``edit`` share is the config field in both.
tests/test_cli_flags.py walks every command and keeps one help and one type per flag.

This module imports nothing heavy, and neither do the method configs (their packages load lazily,
``headwise.lazy``); a verb adds its config's options with ``Parser.later``, on its first parse or ``--help``, so
that building the whole parser reads no config.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any

from ..flags import KINDS, flag, int_or_float, json_value, list_of, number_or_text, option  # noqa: F401
from .constants import RECOVERY_MODES


TASK_NAMES = ("stsb", "lm", "translation", "classification", "long")

# flag → its add_argument keywords (help, type, choices, action, metavar): the one definition of a shared option
SHARED: dict[str, dict[str, Any]] = {
    # model and device
    "--model": {"help": "hub name (org/name), local folder or a named model: minilm, smollm2-135m, "
                        "multi30k-marian-de-en"},
    "--device": {"help": "torch device, e.g. cpu, cuda, cuda:1"},
    "--dtype": {"help": "float32, bfloat16 or float16"},
    "--device-map": {"help": "Accelerate dispatch for models larger than one device: auto, balanced, sequential "
                             "(replaces --device; also folders headwise saved)"},
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
                       "the haystack (the same as --haystack FILE; give one of the two)"},
    "--haystack": {"help": "long: the text around the needles, comma-separated for several (each reported, and "
                           "their macro-average): generated (the default: sentences from word lists), prose "
                           "(WikiText-2, shipped, CC BY-SA 3.0), docs (Python's pydoc topics, PSF), code (Python "
                           "standard-library source, PSF) or a FILE (a UTF-8 text file; --data FILE is the same "
                           "haystack)"},
    "--lengths": {"help": "long: prompt lengths in tokens of the model's tokenizer, comma-separated (2k = 2048)"},
    "--samples": {"type": int, "help": "long: samples per task and length"},
    "--split": {"help": "evaluated split (stsb: train, dev, test; lm: eval = last 10%% of lines, train, all; "
                        "translation: test_2016_flickr; classification: eval (dev), train, test)"},
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


def config_options(parser: Any, config: type, names: typing.Iterable[str] | None = None, *,
                   defaults: dict[str, Any] | None = None, keep_defaults: bool = False) -> None:
    """One option per field of ``config`` (``names``: only these, in this order; default: every init field but the
    selection), through ``headwise.flags``. A shared flag (``SHARED``) keeps its one definition. Without
    ``keep_defaults`` an option left out is absent from the namespace (the config's own default applies;
    ``headwise edit``); with it the option defaults to the field's default, or to ``defaults[name]`` (a verb's own
    choice). A field that moved out of the config (its ``MOVED``) is refused in one line naming where it went."""
    from ..flags import typed_fields

    fields = {f.name: (f, hint) for f, hint in typed_fields(config) if f.name != "selection"}
    for name in (fields if names is None else names):
        f, hint = fields[name]
        missing = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if defaults and name in defaults:
            default = defaults[name]
        given = {"dest": name, "required": missing,
                 "default": None if missing else default if keep_defaults else argparse.SUPPRESS}
        if flag(f) in SHARED:
            action = add(parser, flag(f), **given)
        else:
            action = parser.add_argument(flag(f), help=f.metadata.get("help"), **option(hint, f.metadata), **given)
        action.shown = None if missing else shown_default(default)
        if f.metadata.get("former"):
            kinds = {k: v for k, v in vars(action).items() if k in ("type", "choices")}
            alias(parser, f.metadata["former"], flag(f), name, default=argparse.SUPPRESS, **kinds)
    moved = getattr(config, "MOVED", {})
    trained_by = next((d.trained_by for d in _declarations() if d.config is config), "") if moved else ""
    for name, home in moved.items():  # how the method trains: not what is attached
        parser.add_argument("--" + name.replace("_", "-"), dest=name, action=Moved, home=home, by=trained_by,
                            default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def _declarations() -> list:
    from ..contract import declarations

    return list(declarations().values())


def runs_methods(parser: Any, package: str) -> None:
    """Append to a grouping verb's page the registered methods of the method package ``package`` (e.g.
    ``"headwise.conversion"``) with their docs pages: what the verb runs is one of them (``headwise edit NAME``
    applies it alone). Given to ``Parser.later``, so building the parser reads no declaration."""
    found = [d for d in _declarations() if d.config.__module__.startswith(package + ".")]
    listed = "\n".join(f"  {d.name:<14}{d.doc or package} (headwise edit {d.name} --help)" for d in found)
    head = f"{parser.description}\n\n" if parser.description else ""
    parser.description = f"{head}runs the method{'s' if len(found) > 1 else ''}:\n{listed}"


class Moved(argparse.Action):
    """A field that moved out of a config (``MOVED``): refused in one line naming where it went and, when the
    method's declaration says (``trained_by``), the command that trains it."""

    def __init__(self, option_strings: list[str], dest: str, home: str, by: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.home, self.by = home, by

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        parser.error(f"{option_string} sets how the method trains ({self.home}), not what edit attaches"
                     + (f"; train with {self.by}" if self.by else ""))
