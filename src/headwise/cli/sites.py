"""``headwise sites``: list a model's attention sites (one row per site: kind, layers, heads, positions)."""

from __future__ import annotations

import argparse

from . import model_args
from .output import print_json


# what each page of this verb shows under "examples:" (tests/test_cli_help.py parses every line)
EXAMPLES: dict[str, tuple[str, ...]] = {
    "sites": ("headwise sites",
              "headwise sites --model smollm2-135m"),
}


def register(verbs, parents) -> None:
    p = verbs.add_parser("sites", parents=parents, help="list a model's attention sites")
    model_args(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..models import load_model, native_task
    from ..sites import find_sites
    from .task_options import dispatch_of

    # the model's own class (head included): what it was saved as, so its weights are all there
    model, _ = load_model(args.model, args.device, args.dtype, with_tokenizer=False, task=native_task(args.model),
                          **dispatch_of(args))
    sites = find_sites(model)
    if args.json:
        print_json([s.describe() for s in sites], indent=2)
        return 0
    print(f"{type(model).__name__} ({model.config.model_type}): {len(sites)} attention sites, "
          f"{sum(s.num_heads for s in sites)} heads")
    header = ("site", "path", "kind", "layers", "heads", "kv", "d", "positions", "causal", "notes")
    rows = [(s.name, s.path, s.kind, ",".join(map(str, s.layers)) if s.shared else str(s.layer), str(s.num_heads),
             str(s.num_kv_heads), str(s.head_dim), s.positions, "yes" if s.causal else "no", "; ".join(s.notes))
            for s in sites]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0
