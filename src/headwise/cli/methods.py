"""``headwise methods``: the docs index of every method, read from the declarations (no torch): its name, what it
does, where it is documented, whether the planner tries it, its former names and how to run it."""

from __future__ import annotations

import argparse

from .output import print_json


# what each page of this verb shows under "examples:" (tests/test_cli_help.py parses every line)
EXAMPLES: dict[str, tuple[str, ...]] = {
    "methods": ("headwise methods",
                "headwise methods --json"),
}


def register(verbs, parents) -> None:
    p = verbs.add_parser("methods", parents=parents, help="list every method: what it does, its docs, its command")
    p.set_defaults(run=run)


def index() -> list[dict]:
    """One entry per method, from its declaration (``headwise.contract.declarations``): ``name``, ``summary``,
    ``package``, ``doc`` (its page, or its package's docstring), ``planned`` (its order and role, or None),
    ``former`` (former names), ``example`` (a ``headwise edit`` line)."""
    from ..contract import declarations

    out = []
    for d in declarations().values():
        package = ".".join(d.config.__module__.split(".")[:2])
        out.append({"name": d.name, "summary": d.summary, "package": package,
                    "doc": d.doc or f"the docstring of {package}",
                    "planned": None if d.planned is None else {"order": d.planned.order, "role": d.planned.role},
                    "former": [*d.aliases, *(d.planned.former if d.planned else ())],
                    "example": d.examples[0] if d.examples else f"headwise edit {d.name} --help"})
    return out


def run(args: argparse.Namespace) -> int:
    entries = index()
    if args.json:
        print_json(entries, indent=2)
        return 0
    for e in entries:
        planned = f"planned ({e['planned']['role']}, order {e['planned']['order']})" if e["planned"] else "not planned"
        former = f"; formerly {', '.join(e['former'])}" if e["former"] else ""
        print(f"{e['name']}: {e['summary']}\n  {e['package']}, {planned}{former}; docs: {e['doc']}\n"
              f"  {e['example']}")
    return 0
