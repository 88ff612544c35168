"""``headwise mechanisms list``: the registered efficient attention mechanisms, their arguments and complexity."""

from __future__ import annotations

import argparse
from .output import print_json


# what each page of this verb shows under "examples:" (tests/test_cli_help.py parses every line)
EXAMPLES: dict[str, tuple[str, ...]] = {
    "mechanisms": ("headwise mechanisms list",),
    "mechanisms list": ("headwise mechanisms list",
                        "headwise mechanisms list --json"),
}


def register(verbs, parents) -> None:
    p = verbs.add_parser("mechanisms", parents=parents, help="list the efficient attention mechanisms replace can use")
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = sub.add_parser("list", parents=parents, help="list mechanisms with their arguments and complexity")
    listing.set_defaults(run=run_list)


def run_list(args: argparse.Namespace) -> int:
    from ..mechanisms import list_mechanisms

    records = list_mechanisms()
    if args.json:
        print_json(records, indent=2)
        return 0
    for m in records:
        print(f"{m['name']:<13} {m['complexity']:<28} causal: {'yes' if m['causal'] else 'no ':<4} {m['summary']}")
        for a in m["args"]:
            print(f"    --{a['name'].replace('_', '-'):<18} {a['type']:<6} default {a['default']!s:<8} {a['help']}")
    return 0
