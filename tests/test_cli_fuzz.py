"""Every verb of the command line, fed a malformed value for each option it takes (read from the parser itself):
exit code 2, one line on stderr naming the option, no traceback, nothing written. Parse errors come before any
model loads, so the whole sweep stays fast."""

from __future__ import annotations

import functools

import argparse

import pytest

from headwise.cli import build_parser, main
from headwise.contract import declarations

# values the required arguments get, so that only the option under test is wrong (a value the parser refuses is
# reported while parsing, before missing required arguments are, so the typed sweep needs none of them)
REQUIRED = {"--kv-heads": "1", "--budget": "heads=50%", "--dk": "8", "plan": "plan.json", "mechanism": "local",
            "--out": "out"}


def leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """``(verb path, parser)`` of every runnable (sub)command, its ``later`` options added."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser.complete()
    for action in subs:
        for name, sub in action.choices.items():
            yield from leaves(sub, (*path, name))


def required_args(parser: argparse.ArgumentParser) -> list[str] | None:
    """Valid values of the verb's required arguments, or None when one has no entry in ``REQUIRED``."""
    out = []
    for action in parser._actions:
        name = action.dest if not action.option_strings else action.option_strings[0]
        if (not action.option_strings and action.nargs != 0) or (action.option_strings and action.required):
            if name not in REQUIRED:
                return None
            out += [REQUIRED[name]] if not action.option_strings else [name, REQUIRED[name]]
    return out


def malformed(action: argparse.Action) -> list[str]:
    """Values that must be refused for this option."""
    kind = getattr(action.type, "__name__", None)
    if action.choices is not None:
        return ["nope"]
    if kind in ("int", "float"):
        values = ["abc", "1.5" if kind == "int" else "nan", "inf" if kind == "float" else "1e3"]
        counted = isinstance(action.default, (int, float)) and action.default >= 0
        positive = getattr(action.type, "positive", False)  # POSITIVE destinations and config fields that say so
        if counted or positive:
            values.append("-1")
        if positive:
            values.append("0")
        return values
    if action.dest == "device":
        return ["cuda:99", "gpu0"]
    if action.dest == "dtype":
        return ["fp8"]
    return []


def cases():
    for path, parser in leaves(build_parser()):
        base = list(path)
        for action in parser._actions:
            if not action.option_strings or action.nargs == 0 or action.dest in ("help",):
                continue
            flag = action.option_strings[0]
            for value in malformed(action):
                yield pytest.param([*base, flag, value], flag, id=f"{' '.join(path)} {flag} {value}")


CASES = list(cases())


def test_every_verb_and_typed_option_is_covered():
    verbs = {c.values[0][0] for c in CASES}
    assert {"sites", "analyze", "eval", "prune", "quantize", "compress", "mix", "replace", "kv-policy", "convert",
            "train", "plan", "apply"} <= verbs
    assert len(CASES) > 300


@pytest.mark.parametrize("argv,flag", CASES)
def test_a_malformed_option_exits_2_with_one_line_and_writes_nothing(argv, flag, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("headwise: error:") and flag in err, err
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def model_cases():
    former = {("edit", old) for d in declarations().values() for old in d.aliases}  # the same page, plus a notice
    for path, parser in leaves(build_parser()):
        if path in former:
            continue
        flags = {s for a in parser._actions for s in a.option_strings}
        required = required_args(parser)
        if required is None:  # a verb whose required values this sweep does not know: covered by the typed sweep
            continue
        base = [*path, *required]
        for flag, value in (("--model", "no-such-model"), ("--model", "./no/such/dir"), ("--data", "/no/such.file")):
            if flag in flags:
                yield pytest.param([*base, flag, value], value, id=f"{' '.join(path)} {flag} {value}")


@functools.cache
def converted_smollm2() -> None:
    """SmolLM2's packaged GGUF converted into the cache once (a line and progress bars the first time)."""
    from headwise import HeadwiseError
    from headwise.models import resolve_model

    try:
        resolve_model("smollm2-135m")
    except HeadwiseError:
        pass  # not installed: a command on it then refuses in one line too


@pytest.mark.parametrize("argv,value", list(model_cases()))
def test_a_missing_model_or_data_path_exits_2_with_one_line_and_writes_nothing(argv, value, tmp_path, monkeypatch,
                                                                              capsys):
    converted_smollm2()  # a verb's default model may be it: its one-time conversion is not the command's output
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HEADWISE_DATA_DIR", str(tmp_path / "no-data"))  # nothing found by default either
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("headwise: error:"), err
    assert list(tmp_path.iterdir()) == []
