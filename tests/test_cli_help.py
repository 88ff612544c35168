"""``headwise --help`` and every verb's ``--help`` read well for a new user: the one-line summary on top of the
verb's page and examples at the bottom, every example a command the parser accepts (flags cannot rot)."""

from __future__ import annotations

import shlex

import pytest

from headwise.cli import EXAMPLES, START, build_parser, main

VERBS = tuple(build_parser()._subparsers._group_actions[0].choices)


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
    assert "examples:" in page and verb in EXAMPLES
    for example in EXAMPLES[verb]:
        assert f"  {example}" in page
        argv = shlex.split(example, comments=True)
        assert argv[:2] == ["headwise", verb]
        args = build_parser().parse_args(argv[1:])  # exits (fails the test) on an unknown or malformed flag
        assert args.verb == verb
