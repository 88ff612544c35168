"""``headwise --help`` and every verb's ``--help`` read well for a new user: the one-line summary on top of the
verb's page and examples at the bottom, every example a command the parser accepts (flags cannot rot)."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from headwise.cli import EXAMPLES, START, build_parser, main
from headwise.contract import declarations

SRC = Path(__file__).resolve().parents[1] / "src"
VERBS = tuple(build_parser()._subparsers._group_actions[0].choices)


def examples_of(verb: str) -> tuple[str, ...]:
    """A verb page's examples: ``EXAMPLES``, or for ``edit`` the first example of every method's declaration."""
    return tuple(d.examples[0] for d in declarations().values()) if verb == "edit" else EXAMPLES[verb]


def test_the_top_page_lists_every_verb_and_where_to_start(capsys):
    assert main(["--help"]) == 0
    page = capsys.readouterr().out
    assert all(f"    {verb}" in page for verb in VERBS) and "start here" in page and "docs/quickstart.md" in page
    commands = [shlex.split(line, comments=True) for line in START.splitlines()[1:] if "VERB" not in line]
    assert commands and all(build_parser().parse_args(argv[1:]).verb == argv[1] for argv in commands)


@pytest.mark.parametrize("verb", VERBS)
def test_every_verb_page_has_its_summary_and_examples_that_parse(verb, capsys):
    assert main([verb, "--help"]) == 0
    page = capsys.readouterr().out
    summary = next(a.help for a in build_parser()._subparsers._group_actions[0]._choices_actions if a.dest == verb)
    description = " ".join(page.split("\n\n")[1].split())  # the paragraph under the usage lines
    assert description == summary or (verb == "edit" and description.startswith("Apply one registered method"))
    assert "examples:" in page and examples_of(verb)
    for example in examples_of(verb):
        assert f"  {example}" in page
        argv = shlex.split(example, comments=True)
        assert argv[:2] == ["headwise", verb]
        args = build_parser().parse_args(argv[1:])  # exits (fails the test) on an unknown or malformed flag
        assert args.verb == verb


def sub_commands() -> list[tuple[str, str]]:
    """``(verb, name)`` of every sub-command page (``eval lm``, ``convert gqa``, ...) but edit's methods."""
    out = []
    for verb, parser in build_parser()._subparsers._group_actions[0].choices.items():
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction) and verb != "edit":
                out += [(verb, name) for name in action.choices]
    return out


@pytest.mark.parametrize("verb, name", sub_commands())
def test_every_sub_command_page_has_its_summary_and_examples_that_parse(verb, name, capsys):
    assert main([verb, name, "--help"]) == 0
    page = capsys.readouterr().out
    assert " ".join(page.split("\n\n")[1].split()) and "examples:" in page
    for example in EXAMPLES[f"{verb} {name}"]:
        assert f"  {example}" in page
        argv = shlex.split(example, comments=True)
        args = build_parser().parse_args(argv[1:])
        assert argv[1:3] == [verb, name] and args.verb == verb


# pages whose method options are a config's fields (Parser.later): added on the page's first use, without torch
# pages finished on first use: a config's fields, or the methods a verb runs (``options.runs_methods``)
CONFIG_PAGES = {("prune",), ("quantize",), ("compress",), ("mix",), ("convert",), ("replace",), ("convert", "gqa"),
                ("convert", "latent")}


def test_building_the_parser_and_every_help_page_imports_no_torch():
    """``headwise --help`` answers at once: the parser and every page, those whose options are a config's fields
    (``CONFIG_PAGES``, ``edit METHOD`` and its hidden former names) included, are built from light modules: the
    methods' declarations and configs import no torch (checked in a fresh process through sys.modules)."""
    pages = [[], *([verb] for verb in VERBS), *([verb, name] for verb, name in sub_commands())]
    later = {tuple(argv) for argv in pages if argv and _parser(argv).pending}
    assert later == CONFIG_PAGES
    pages += [["edit", name] for d in declarations().values() for name in (d.name, *d.aliases)]
    script = "\n".join([
        "import contextlib, io, sys",
        "from headwise.cli import build_parser",
        f"for argv in {pages!r}:",
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):",
        "        build_parser().parse_args(argv + ['--help'])",
        "print(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules))",
    ])
    env = dict(os.environ, PYTHONPATH=str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.strip() == "[]", done.stderr
    assert len(pages) > 30


def _parser(argv: list[str]) -> argparse.ArgumentParser:
    """The parser of the command ``argv`` (``["convert", "gqa"]``), as built (its ``later`` options not added)."""
    parser = build_parser()
    for name in argv:
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    return parser


def test_the_light_copies_equal_the_library():
    """What the parser shows without importing torch is what the library defines (no copy names a method: the
    methods' pages, names and former names come from their declarations)."""
    from headwise.cli import constants
    from headwise.contract import METHODS, load_methods
    from headwise.kvcache.generation import PREFILL_CHUNK
    from headwise.planning.candidates import plannable
    from headwise.training.memory import MEMORY_MODES
    from headwise.training.recovery import MODES

    load_methods()
    assert constants.RECOVERY_MODES == MODES and constants.TRAIN_MEMORY_MODES == MEMORY_MODES
    assert constants.PREFILL_CHUNK == PREFILL_CHUNK
    assert {name: d.summary for name, d in declarations().items()} == {n: m.summary for n, m in METHODS.items()}
    plan_page = _parser(["plan"]).format_help()
    assert ",".join(m.name for m in plannable()) in "".join(plan_page.split())  # the list may wrap at a comma


def test_edit_method_pages_get_their_options_when_chosen(capsys):
    assert main(["edit", "masks", "--help"]) == 0
    assert "--masks JSON|@FILE" in capsys.readouterr().out
    assert main(["edit", "--help"]) == 0
    page = capsys.readouterr().out
    assert all(name in page for name in ("masks", "prune_heads", "kv_policy", "replace"))
    assert not re.search(r"^ +mechanism ", page, re.M)  # the former name of replace: hidden, still accepted
    assert main(["edit", "mechanism", "--help"]) == 0
    assert "--mechanism" in capsys.readouterr().out


def test_convert_takes_data_and_keeps_text_as_a_hidden_alias(capsys):
    assert "--text" not in (main(["convert", "gqa", "--help"]), capsys.readouterr().out)[1]
    args = build_parser().parse_args(["convert", "gqa", "--kv-heads", "1", "--text", "a.txt", "--out", "o"])
    assert args.data == "a.txt" and "--text is now --data" in capsys.readouterr().err
    assert build_parser().parse_args(["convert", "latent", "--data", "b.txt", "--out", "o"]).data == "b.txt"


def test_a_light_import_still_reads_every_checkpoint(tmp_path):
    """``import headwise`` no longer imports the method packages, yet a fresh process that imports only
    ``headwise.io`` reloads a checkpoint whose journal and ops name methods it never imported (pruned heads, a
    quantizer), with the same outputs."""
    import torch
    from tiny import tiny_inputs, tiny_model

    import headwise

    model = tiny_model("bert")
    headwise.prune_heads(model, {s.path: [0] for s in headwise.find_sites(model)})
    headwise.quantize_attention(model, quantizer="bin")
    headwise.save_pretrained(model, tmp_path / "model")
    inputs, _ = tiny_inputs("bert")
    torch.save({k: v for k, v in inputs.items()}, tmp_path / "inputs.pt")
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
    script = (f"import torch; from headwise.io import from_pretrained; m = from_pretrained({str(tmp_path / 'model')!r});"
              f" x = torch.load({str(tmp_path / 'inputs.pt')!r});"
              f" torch.save(m(**x).last_hidden_state.detach(), {str(tmp_path / 'out.pt')!r})")
    env = dict(os.environ, PYTHONPATH=str(SRC), HF_HUB_OFFLINE="1")
    subprocess.run([sys.executable, "-c", script], check=True, env=env, capture_output=True)
    assert torch.equal(torch.load(tmp_path / "out.pt"), expected)


def test_every_edit_method_page_has_examples_that_parse(capsys):
    for name, declaration in declarations().items():
        assert main(["edit", name, "--help"]) == 0
        page = capsys.readouterr().out
        assert "examples:" in page and declaration.examples
        for example in declaration.examples:
            assert f"  {example}" in page
            args = build_parser().parse_args(shlex.split(example, comments=True)[1:])
            assert args.verb == "edit" and args.method_name == name
