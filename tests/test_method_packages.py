"""The rule of docs/design.md ("A method's package, verb and page"), over every registered method: its hooks live in
the package named for it or in the one the design table names, ``headwise edit NAME --help`` names its docs page,
that page exists, and the verb the table names lists the method with its page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from headwise.cli import main
from headwise.contract import METHODS, load_methods

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## A method's package, verb and page"


def table() -> dict[str, dict[str, str]]:
    """``{method: {"package", "verb", "page"}}`` read from the design table's rows."""
    text = (ROOT / "docs" / "design.md").read_text()
    assert SECTION in text, "docs/design.md lost the section that states the rule"
    rows = {}
    for line in text.split(SECTION, 1)[1].split("\n## ", 1)[0].splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) != 5 or not cells[0].startswith("`"):
            continue
        methods, package, _, verb, page = cells
        for name in re.findall(r"`([^`]+)`", methods):
            rows[name] = {"package": f"headwise.{package.strip('`')}", "verb": verb.strip("`").split()[0],
                          "page": page}
    return rows


load_methods()
TABLE = table()


def test_the_table_names_only_registered_methods():
    assert TABLE and set(TABLE) <= set(METHODS), sorted(set(TABLE) - set(METHODS))


@pytest.mark.parametrize("name", sorted(METHODS))
def test_a_method_lives_in_its_package_and_its_pages_name_its_doc(name, capsys):
    method = METHODS[name]
    row = TABLE.get(name, {"package": f"headwise.{name}"})
    hooks_package = ".".join(type(method.hooks).__module__.split(".")[:2])
    assert hooks_package == row["package"], f"{name}: hooks in {hooks_package}, the rule names {row['package']}"
    assert ".".join(method.config.__module__.split(".")[:2]) == row["package"]
    doc = method.declaration.doc
    if "page" in row:
        assert doc == row["page"], f"{name}: declared doc {doc!r}, the table says {row['page']!r}"
    assert doc and (ROOT / doc.split("#")[0]).is_file(), f"{name}: its page {doc!r} does not exist"
    assert main(["edit", name, "--help"]) == 0
    assert f"docs: {doc}" in capsys.readouterr().out


@pytest.mark.parametrize("verb", sorted({row["verb"] for row in TABLE.values()} - {"edit"}))  # edit: every page
def test_a_verb_that_runs_methods_lists_each_with_its_page(verb, capsys):
    assert main([verb, "--help"]) == 0
    page = capsys.readouterr().out
    runs = page.split("runs the method", 1)[1].split("\n\n", 1)[0]
    for name, row in TABLE.items():
        if row["verb"] == verb:
            assert re.search(rf"^  {name} +{re.escape(row['page'])} \(headwise edit {name} --help\)$", runs, re.M), \
                f"headwise {verb} --help does not list {name} with {row['page']}"
