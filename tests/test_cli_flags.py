"""A flag means one thing: over every leaf command (every verb, its sub-commands such as ``eval lm`` and ``convert
gqa``, and every ``edit METHOD``), each flag has one help text and one type, and every option has help. Method
options are their config's fields, with the field's help; a renamed flag still works, hidden, with a notice."""

from __future__ import annotations

import argparse
from collections import defaultdict

import pytest

from headwise.cli import build_parser, main
from headwise.cli.options import SHARED
from headwise.contract import METHODS, config_fields, load_methods
from headwise.flags import flag as field_flag


def leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """``(path, parser)`` of every leaf command, its ``later`` options added."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield " ".join(path), parser.complete()
    for sub in subs:
        for name in list(sub.choices):
            yield from leaves(sub.choices[name], (*path, name))


def kind(action: argparse.Action) -> tuple:
    """What a flag takes: its action, its type and its choices."""
    return type(action).__name__, getattr(action.type, "__name__", None), tuple(action.choices or ())


def options():
    """``(command, flag, action)`` of every visible option of every leaf command."""
    load_methods()
    for command, parser in leaves(build_parser()):
        for action in parser._actions:
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help" and action.help != argparse.SUPPRESS:
                    yield command, flag, action


def test_every_flag_has_one_help_and_one_type_in_every_command():
    helps, kinds = defaultdict(lambda: defaultdict(list)), defaultdict(lambda: defaultdict(list))
    for command, flag, action in options():
        helps[flag][action.help].append(command)
        kinds[flag][kind(action)].append(command)
    two = [f"{flag}: {dict(seen)}" for table in (helps, kinds) for flag, seen in sorted(table.items()) if len(seen) > 1]
    assert not two, "flags with two helps or two types:\n" + "\n".join(two)
    assert len(helps) > 100 and {"--kinds", "--quantizer", "--gqa-init", "--threshold"} <= set(helps)


def test_every_option_has_help():
    empty = sorted({f"{command} {flag}" for command, flag, action in options() if not (action.help or "").strip()})
    assert not empty, f"options without help: {empty}"


def test_every_edit_page_shows_its_config_fields_help(capsys):
    """Each field's own help (a field whose flag is a shared option, e.g. --kinds, shows that option's)."""
    load_methods()
    for name, method in METHODS.items():
        assert main(["edit", name, "--help"]) == 0
        page = " ".join(capsys.readouterr().out.split())
        for f in (f for f, _ in config_fields(method.config) if f.name != "selection"):
            flag = field_flag(f)
            text = SHARED[flag]["help"] if flag in SHARED else f.metadata["help"]
            assert flag in page and " ".join(text.split()[:4]) in page, f"edit {name}: no help for {f.name}"
    assert main(["edit", "quantization", "--help"]) == 0
    assert "--scope {tensor,example,row}" in capsys.readouterr().out  # a Literal field shows its choices


@pytest.mark.parametrize("argv, dest, value", [
    (["edit", "gqa", "--kv-heads", "1", "--init", "mean", "--out", "x"], "init", "mean"),
    (["edit", "quantization", "--method", "log", "--out", "x"], "quantizer", "log"),
    (["quantize", "--bits", "3,4"], "bits", "3,4"), (["quantize", "--methods", "log"], "methods", "log"),
    (["kv-policy", "--ranking", "random"], "ranking", "random"),
    (["prune", "--method", "importance", "--keep", "3"], "strategy", "importance"),
    (["apply", "plan.json", "--recover-max-steps", "2"], "recover_steps", 2),
    (["convert", "latent", "--kv-budget", "0.5", "--init", "svd", "--out", "x"], "init", "svd"),
])
def test_a_renamed_flag_still_works_with_a_one_line_notice(argv, dest, value, capsys):
    assert getattr(build_parser().parse_args(argv), dest) == value
    notice = capsys.readouterr().err.strip().splitlines()
    assert len(notice) == 1 and "still works" in notice[0]


def test_edit_refuses_a_training_setting_in_one_line(capsys):
    assert main(["edit", "l0", "--lam", "5", "--out", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--lam sets how the method trains (L0Training)" in err[0]


def test_flags_that_meant_two_things_now_mean_one():
    flags = defaultdict(set)
    for command, flag, _ in options():
        flags[flag].add(command)
    assert flags["--window"] == {"kv-policy"}  # convert's tokens per sequence is --max-length
    assert "mix" not in flags["--finetune"] and "mix" in flags["--mix-epochs"]  # --finetune is the recovery shorthand
    assert "apply" not in flags["--epochs"] and "apply" in flags["--recover-epochs"]
    assert "compress" in flags["--limit"] and "compress" in flags["--calibration-limit"]
    assert "plan" in flags["--calibration-limit"] and "plan" not in flags.get("--calibration", set())
    assert "train translation" not in flags["--max-tokens"] and "train translation" in flags["--batch-tokens"]
    assert "train translation" not in flags["--layers"]  # --layers selects layers (headwise edit)
    assert "edit l0" in flags["--gate-temperature"] and "edit l0" not in flags["--temperature"]
    assert "kv-policy" in flags["--kv-ranking"] and "kv-policy" not in flags["--ranking"]
