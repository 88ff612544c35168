"""The KV-policy section: the verdict, which KV heads keep the full cache, and every head score per KV head."""

from __future__ import annotations

from . import svg
from .builder import Report

SCORES = {"retrieval": "mass on the passkey while predicting it", "copy": "arg-max on the digit being copied",
          "induction": "mass on the token after the previous occurrence", "echo": "mass on the previous occurrence",
          "outside": "mass a sink + window cache would drop",
          "learned": "gate alpha: 1 full attention, 0 sink + window (DuoAttention-style, trained)"}


def add_kv_policy_section(report: Report, summary: dict, scores: dict) -> None:
    """``summary`` / ``scores``: the ``summary.json`` and ``scores.json`` written by ``headwise kv-policy``."""
    verdict = summary["verdict"]
    section = report.add_section("KV cache policy", f"{verdict['memory']}. {verdict['quality']}. "
                                                    f"Use it: `{verdict['use']}`")
    kv = scores["per_kv_head"]
    layers = len(next(iter(kv.values()))) if kv else len(summary["full_heads"])
    heads = len(next(iter(kv.values()))[0]) if kv else 1
    full = {tuple(p) for p in summary["full_heads"]}
    grid = [[1 if (layer, h) in full else 0 for h in range(heads)] for layer in range(layers)]
    section.figure(svg.heatmap(grid, [str(layer) for layer in range(layers)], [str(h) for h in range(heads)],
                               "full cache (1) or sink + window (0)", vmin=0, vmax=1, xlabel="KV head",
                               ylabel="layer", legend="full", annotate=False),
                   f"{len(full)} of {layers * heads} KV heads keep every token; the others keep "
                   f"{summary['sink']} sink + {summary['window']} recent tokens.")
    figures = [(svg.heatmap(values, [str(layer) for layer in range(len(values))],
                            [str(h) for h in range(len(values[0]))], name, xlabel="KV head", ylabel="layer",
                            legend=name, annotate=False), SCORES.get(name, name))
               for name, values in kv.items()]
    section.grid(figures)
