"""The KV-policy section: the verdict, which KV heads keep the full cache, and every head score per KV head."""

from __future__ import annotations

from . import svg
from .builder import Report

SCORES = {"retrieval": "mass on the passkey while predicting it", "copy": "arg-max on the digit being copied",
          "lookup": "mass on the asked word of one fact among look-alikes while saying it",
          "induction": "mass on the token after the previous occurrence", "echo": "mass on the previous occurrence",
          "outside": "mass a sink + window cache would drop",
          "learned": "gate alpha: 1 full attention, 0 sink + window (DuoAttention-style, trained)"}


def add_kv_policy_section(report: Report, summary: dict, scores: dict) -> None:
    """``summary`` / ``scores``: the ``summary.json`` and ``scores.json`` written by ``headwise kv-policy``."""
    verdict = summary["verdict"]
    section = report.add_section("KV cache policy", f"{verdict['memory']}. {verdict['quality']}. "
                                                    f"Use it: `{verdict['use']}`")
    measured, check = summary.get("measured"), summary.get("passkey_check") or summary.get("long_check") or {}
    if measured or check:
        section.heading("What you get (measured in this run)")
        section.table(_measured_rows(measured, check), ["", "full cache", "policy", "policy vs full"])
        if measured:
            section.text(verdict["measured"])
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


def _measured_rows(measured: dict | None, check: dict) -> list[list[object]]:
    """Rows of the measured table: KV MiB held, peak memory, prefill, decode speed, passkeys found."""
    rows = []
    if measured:
        full, policy, ratio = measured["full"], measured["policy"], measured["ratio"]

        def mib(value: float | None) -> str:
            return "—" if value is None else f"{value / 2 ** 20:.1f}"

        def times(value: float | None) -> str:
            return "—" if value is None else f"{value:.2f}x"

        tokens = f"{measured['prompt_tokens']} + {measured['new_tokens']} tokens"
        rows += [[f"KV MiB held after {tokens}", mib(full["kv_bytes"]), mib(policy["kv_bytes"]),
                  times(ratio["kv_bytes"])],
                 [f"peak {measured['memory']} above start, MiB", mib(full["peak_memory_above_start"]),
                  mib(policy["peak_memory_above_start"]), times(ratio["peak_memory_above_start"])],
                 ["prefill s", f"{full['prefill_s']:.2f}", f"{policy['prefill_s']:.2f}", times(ratio["prefill_s"])],
                 ["decode tokens/s", f"{full['decode_tokens_per_s']:.1f}", f"{policy['decode_tokens_per_s']:.1f}",
                  times(ratio["decode_tokens_per_s"])]]
    if check and "correct" in check["full"]:  # the passkey check
        rows.append([f"passkeys found ({check['family']}, up to {check['length']} tokens)",
                     f"{check['full']['correct']}/{check['full']['prompts']}",
                     f"{check['policy']['correct']}/{check['policy']['prompts']}", ""])
    elif check:  # the long-context suite's subset: macro-average and each task, same samples for both
        full, policy = check["full"], check["policy"]
        rows.append(["long-context score (0-100, 95% interval)",
                     f"{full['score']:.1f} ({full['score_ci'][0]:.1f}-{full['score_ci'][1]:.1f})",
                     f"{policy['score']:.1f} ({policy['score_ci'][0]:.1f}-{policy['score_ci'][1]:.1f})",
                     f"{check['difference']['difference']:+.1f} points"])
        rows += [[f"  {task} ({sum(policy['samples'][task].values())} samples)", f"{full['tasks'][task]:.1f}",
                  f"{policy['tasks'][task]:.1f}", f"{policy['tasks'][task] - full['tasks'][task]:+.1f} points"]
                 for task in policy["tasks"]]
    return rows
