"""The long-context suite's page: the score of a run per task and length (``headwise eval long``), and, for a
comparison of caches (``experiments/kv_long_suite.py``), the score of every arm against the KV bytes it holds."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from ..io import atomic_write_text
from . import svg
from .builder import Report

RESULTS_FILE = "results.json"
SAMPLES_FILE = "samples.jsonl"


def _length(n: str | int) -> str:
    n = int(n)
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def score_table(result: Mapping[str, Any]) -> tuple[list[str], list[list[object]]]:
    """``(header, rows)``: one row per task (its family, the score at each length, the mean, samples per length)."""
    lengths = list(result["lengths"])
    header = ["task", "family"] + [_length(n) for n in lengths] + ["mean", "samples"]
    families = result.get("task_families", {})
    rows = [[task, families.get(task, "")] + [f"{result['cells'][task][n]:.1f}" if n in result["cells"][task] else "—"
                                            for n in lengths]
            + [f"{score:.1f}", "/".join(str(result["samples"][task].get(n, 0)) for n in lengths)]
            for task, score in result["tasks"].items()]
    rows.append(["all tasks", "macro"] + [f"{result['lengths'][n]:.1f}" for n in lengths] + [f"{result['score']:.1f}",
                                                                                            ""])
    return header, rows


def drawn_lines(result: Mapping[str, Any]) -> list[str]:
    """What the samples were drawn from: seed, then each haystack's source and licence."""
    drawn = result["drawn_from"]
    each = drawn["haystacks"] if "haystacks" in drawn else {drawn["haystack_name"]: drawn}
    return [f"drawn from seed {next(iter(each.values()))['seed']}"] + [
        f"haystack {name}: {d['haystack']}; licence: {d['licence']}" for name, d in each.items()]


def haystack_lines(result: Mapping[str, Any]) -> list[str]:
    """One line per haystack of a run over several: its score and interval."""
    return [f"{name}: {s['score']:.1f} (95% interval {s['score_ci'][0]:.1f}–{s['score_ci'][1]:.1f})"
            for name, s in result.get("haystacks", {}).items()]


def long_lines(result: Mapping[str, Any], model: str) -> list[str]:
    """The text ``headwise eval long`` prints: the macro-average with its interval, each haystack's score (when
    several), then the task table and what the samples were drawn from."""
    lo, hi = result["score_ci"]
    header, rows = score_table(result)
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    table = ["  " + "  ".join(str(x).ljust(w) for x, w in zip(row, widths)) for row in [header, *rows]]
    over = f"{len(result['haystacks'])} haystacks, " if "haystacks" in result else f"haystack {result['haystack']}, "
    return [f"long: {model}",
            f"  score {result['score']:.1f} (95% interval {lo:.1f}–{hi:.1f}): macro-average over {over}"
            f"{len(result['tasks'])} tasks and {len(result['lengths'])} length(s), {result['questions']} questions",
            *[f"  {line}" for line in haystack_lines(result)], *table, *[f"  {line}" for line in drawn_lines(result)]]


def add_long_section(report: Report, result: Mapping[str, Any], title: str = "Long-context suite") -> None:
    """A section with the task × length table and a bar chart of the task scores."""
    lo, hi = result["score_ci"]
    section = report.add_section(title, f"Macro-average {result['score']:.1f} (95% interval {lo:.1f}–{hi:.1f}) "
                                        f"over {len(result['tasks'])} tasks, {result['questions']} questions; "
                                        + "; ".join(haystack_lines(result) + drawn_lines(result)) + ".")
    header, rows = score_table(result)
    section.table(rows, header)
    section.figure(svg.bars(list(result["tasks"].values()), list(result["tasks"]), "score per task (0–100)"),
                   "The share of expected strings found in the greedy answers (RULER's string match), per task, "
                   "averaged over lengths.")


def arms_chart(points: Mapping[str, list[tuple[float, float]]], title: str) -> str:
    """Score (0–100) against the share of the full cache's KV bytes held, one line per arm (``points[arm]``:
    ``(bytes share, score)`` pairs)."""
    series = {arm: ([x for x, _ in sorted(p)], [y for _, y in sorted(p)]) for arm, p in points.items()}
    return svg.lines(series, "KV bytes held / full cache", "macro-average score", title, ylim=(0, None))


def write_long_run(out: str | os.PathLike, result: Mapping[str, Any], model: str) -> Path:
    """``out/results.json`` and ``out/report.html`` of one ``eval long`` run (``out/samples.jsonl``, the per-sample
    log, is written while it runs); returns the report's path."""
    out = Path(out)
    atomic_write_text(out / RESULTS_FILE, json.dumps(dict(result), indent=1) + "\n")
    report = Report("Long-context suite", f"`{model}`", {"score": f"{result['score']:.1f}",
                                                        "lengths": ", ".join(_length(n) for n in result["lengths"]),
                                                        "haystack": result["haystack"]})
    add_long_section(report, result)
    return report.write(out, overwrite=True)
