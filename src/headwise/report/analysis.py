"""The standard analysis report: every per-head metric of a ``stats.json`` as an HTML page.

``write_report(stats, out_dir)`` is what the CLI calls; ``analysis_report(stats)`` returns the
:class:`~headwise.report.builder.Report` so callers can append their own sections (pruning curves,
quantization tables, ...) before writing it.
"""

from __future__ import annotations

import math
import os
import shlex
from html import escape
from pathlib import Path
from typing import Sequence

from ..errors import HeadwiseError
from ..sites import KINDS
from . import svg
from .builder import Report

Table = list[list[float | None]]

FAMILIES: list[tuple[str, str]] = [
    ("importance", "**Importance** says how much the model needs a head. *Gradient* importance is a first-order "
                   "estimate of how much the loss would change if the head were masked; *ablation* importance "
                   "measures the change by actually switching the head off. Higher = more important. Heads near "
                   "zero contribute little and are the first candidates for pruning."),
    ("confidence", "**Confidence** is how sharply a head focuses: the largest attention weight a token gives, "
                   "averaged over tokens. Close to 1 = each token puts nearly all its attention on one other token "
                   "(a sharp, often specialised head); low = attention spread over many tokens. The *no special* "
                   "variant ignores special tokens such as [CLS], [SEP] or <s>, where many heads park attention "
                   "when they have nothing to do."),
    ("mhr", "**MHR** scores look at a head's strongest links. *Base*: the single largest attention weight in the "
            "head's whole map for a sentence. *Advanced*: for each token, the most attention any other token pays "
            "to it, averaged over tokens. High = the head forms a few very strong links (specialised)."),
    ("entropy", "**Entropy** measures how spread out a head's attention is. Low = focused on few tokens; "
                "high = smeared across the sentence (averaging heads)."),
    ("distance", "**Distance** is how far away, in tokens, a head looks on average (attention-weighted distance "
                 "between a token and the tokens it attends to). Small = local heads reading neighbours; large = "
                 "long-range heads."),
    ("positional", "**Positional shares** are the fraction of attention going to special tokens, to the token "
                   "itself, to the previous token and to the next token. Above 0.5 that pattern dominates the "
                   "head: previous/next-token heads track word order; heads that mostly attend to special tokens "
                   "often do little and are pruning candidates."),
    ("sparsity", "**Sparsity** is the share of attention weights below a tiny threshold (the number after @). "
                 "High = almost all weights negligible, attention concentrated on a few tokens."),
    ("other", "**Other metrics** recorded by the analysis."),
]
FAMILY_TITLES = {"importance": "Importance", "confidence": "Confidence", "mhr": "MHR scores", "entropy": "Entropy",
                 "distance": "Attention distance", "positional": "Positional shares", "sparsity": "Sparsity",
                 "other": "Other metrics"}
POSITIONAL = ("special", "self", "prev", "next")
POSITION_WORDS = {"prev": "previous token", "next": "next token", "self": "itself", "special": "special tokens"}


def metric_family(name: str) -> str:
    """The family (see :data:`FAMILIES`) a metric name belongs to."""
    if name in POSITIONAL:
        return "positional"
    for family in ("importance", "confidence", "mhr", "entropy", "distance", "sparsity"):
        if name.startswith(family):
            return family
    return "other"


# ---------------------------------------------------------------------------------------------- input


def short_model_name(name: str) -> str:
    """A model name for titles: hub names as they are, local paths cut to their last two parts."""
    if name.startswith(("/", ".", "~")) or "\\" in name or name.count("/") > 1:
        parts = [p for p in name.replace("\\", "/").split("/") if p]
        return "/".join(parts[-2:]) or name
    return name


def check_stats(stats: dict) -> None:
    """Raise :class:`HeadwiseError` unless ``stats`` looks like a version-1 ``stats.json``."""
    if not isinstance(stats, dict) or stats.get("headwise_stats") != 1:
        raise HeadwiseError("not a headwise stats file (expected \"headwise_stats\": 1); "
                            "produce one with `headwise analyze`")
    sites = stats.get("sites")
    if not isinstance(sites, list) or not sites:
        raise HeadwiseError("stats file has no \"sites\"; it is incomplete or from another tool")
    heads = stats.get("heads")
    if not isinstance(heads, dict):
        raise HeadwiseError("stats file has no \"heads\" table")
    for name, table in heads.items():
        if not isinstance(table, list) or len(table) != len(sites):
            raise HeadwiseError(f"stats metric {name!r} has {len(table) if isinstance(table, list) else 'no'} rows "
                                f"for {len(sites)} sites; the file is inconsistent")


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _clean(table: Sequence[Sequence[object]]) -> Table:
    return [[_num(v) for v in row] for row in table]


def row_labels(sites: Sequence[dict]) -> list[str]:
    """Short labels for the rows: ``L3`` when all rows are one kind of attention, else the site name."""
    kinds = {s.get("kind") for s in sites}

    def layer_text(s: dict) -> str:
        layers = list(s.get("layers") or [])
        if len(layers) == 1:
            return str(layers[0])
        if layers and layers == list(range(layers[0], layers[-1] + 1)):
            return f"{layers[0]}–{layers[-1]}"
        return ",".join(map(str, layers)) or "?"

    labels = [f"L{layer_text(s)}" if len(kinds) == 1 else str(s.get("name", f"row{i}")) for i, s in enumerate(sites)]
    if len(set(labels)) < len(labels):  # e.g. a shared module listed once per layer
        labels = [f"{lab}#{i}" for i, lab in enumerate(labels)]
    return labels


def _quantile(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    pos = q * (len(s) - 1)
    i = int(pos)
    return s[i] if i + 1 >= len(s) else s[i] + (s[i + 1] - s[i]) * (pos - i)


def _ranked(table: Table, labels: Sequence[str]) -> list[tuple[str, float, int, int]]:
    """All heads with a value as ``(label, value, row, head)``, highest value first."""
    items = [(f"{labels[r]} H{h}", v, r, h) for r, row in enumerate(table) for h, v in enumerate(row) if v is not None]
    return sorted(items, key=lambda t: -t[1])


class _Context:
    """Parsed stats shared by the section builders."""

    def __init__(self, stats: dict) -> None:
        check_stats(stats)
        self.stats = stats
        self.sites: list[dict] = stats["sites"]
        self.labels = row_labels(self.sites)
        self.heads: dict[str, Table] = {k: _clean(v) for k, v in stats["heads"].items()}
        self.info: dict[str, dict] = stats.get("metric_info") or {}

    def label(self, metric: str) -> str:
        return str(self.info.get(metric, {}).get("label") or metric)

    def description(self, metric: str) -> str:
        return str(self.info.get(metric, {}).get("description") or "")

    def higher(self, metric: str) -> str | None:
        return self.info.get(metric, {}).get("higher")

    def value_range(self, metric: str) -> tuple[float | None, float | None]:
        rng = self.info.get(metric, {}).get("range")
        if isinstance(rng, (list, tuple)) and len(rng) == 2:
            return _num(rng[0]), _num(rng[1])
        return None, None

    def max_heads(self) -> int:
        return max((len(row) for t in self.heads.values() for row in t), default=0)

    def family_metrics(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for name in self.heads:
            out.setdefault(metric_family(name), []).append(name)
        return {f: out[f] for f, _ in FAMILIES if f in out}

    def importance_metric(self) -> str | None:
        for name in ("importance_ablation", "importance_gradient"):
            if name in self.heads:
                return name
        return next((n for n in self.heads if n.startswith("importance")), None)

    def confidence_metric(self) -> str | None:
        return next((n for n in ("confidence_no_special", "confidence") if n in self.heads), None)


# ---------------------------------------------------------------------------------------------- sections


def _metric_heatmap(ctx: _Context, name: str, max_width: float = 560) -> tuple[str, str]:
    table = ctx.heads[name]
    lo, hi = ctx.value_range(name)
    values = [v for row in table for v in row if v is not None]
    cmap = "viridis"
    data_lo = min(values) if values else 0.0
    data_hi = max(values) if values else 1.0
    if (lo is None or lo < 0) and data_lo < 0 < data_hi:  # signed values: centre a diverging map on zero
        bound = max(abs(data_lo), abs(data_hi))
        lo, hi, cmap = -bound, bound, "diverging"
    higher = ctx.higher(name)
    legend = f"higher = more {higher}" if higher else ctx.label(name)
    label = ctx.label(name)
    title = label[:1].upper() + label[1:] + ("" if label == name else f" ({name})")
    figure = svg.heatmap(table, ctx.labels, [f"H{h}" for h in range(ctx.max_heads())], title, lo, hi, cmap,
                         xlabel="head", ylabel="layer", legend=legend, max_width=max_width)
    scale = "blue = negative, red = positive" if cmap == "diverging" else "dark = low, yellow = high"
    caption = " ".join(x for x in (ctx.description(name), f"Colour: {scale}. Hover a cell for its exact value.") if x)
    return figure, caption


def removable_heads(ctx: _Context, share: float = 0.25) -> tuple[str | None, list[str]]:
    """``(importance metric, heads whose importance is below share × the median head's)``, least important
    first; ``(None, [])`` without an importance measure."""
    name = ctx.importance_metric()
    if name is None:
        return None, []
    ranked = _ranked(ctx.heads[name], ctx.labels)
    median = _quantile([v for _, v, _, _ in ranked], 0.5)
    return name, [lab for lab, v, _, _ in reversed(ranked) if v < share * median]


def plan_command(stats: dict, heads: int) -> str:
    """The ``headwise plan`` command for the run these stats came from, at ``heads`` heads: with the options
    ``headwise analyze`` recorded (``run_options``: model, task, data, split, lengths; ``headwise.cli.suggest``), so
    that it runs as printed; stats without them (``headwise.analyze`` from Python) give their model and task."""
    options = stats.get("run_options")
    if options is None:
        model = str(stats.get("model") or "")
        options = ([] if not model or "packaged" in model else ["--model", model]) \
            + (["--task", str(stats["task"])] if stats.get("task") else [])
    return shlex.join(["headwise", "plan", *options, "--budget", f"heads={heads}", "--out", "headwise-plan"])


def _verdict(report: Report, ctx: _Context) -> None:
    total = sum(int(s.get("num_heads", 0)) for s in ctx.sites)
    name, weak = removable_heads(ctx)
    if name is None:
        text = ("**No importance was measured**, so this page cannot say which heads are removable (run "
                "`headwise analyze --importance gradient`). To get a measured answer at a budget, run "
                f"`{plan_command(ctx.stats, max(len(ctx.sites), total // 2))}`.")
    elif not weak:
        text = (f"**No head stands out as removable**: by {ctx.label(name)}, every head carries at least a quarter "
                "of the median head's importance. Removing heads will cost quality; measure what a budget costs "
                f"with `{plan_command(ctx.stats, max(len(ctx.sites), total * 3 // 4))}`.")
    else:
        keep = max(len(ctx.sites), total - len(weak))
        shown = ", ".join(weak[:12]) + (f" and {len(weak) - 12} more" if len(weak) > 12 else "")
        text = (f"**{len(weak)} of {total} heads look removable**: by {ctx.label(name)} they carry less than a "
                f"quarter of the median head's importance ({shown}). This is a ranking, not a measurement: "
                f"`{plan_command(ctx.stats, keep)}` measures removal (and the other edits) on the task, "
                "draws the Pareto front and writes the `headwise apply` command.")
    report.add_section("Verdict", text)


def _overview(report: Report, ctx: _Context) -> None:
    sec = report.add_section("How to read this page", intro=(
        "Each attention layer has several **heads**, each free to learn its own pattern of which tokens to look "
        "at. The heatmaps below have one row per layer and one column per head, so every cell is one head; "
        "hover a cell to see its exact value. Hatched grey cells mean the layer has no head there (e.g. after "
        "pruning)."))
    families = ctx.family_metrics()
    for family, text in FAMILIES:
        if family not in families:
            continue
        details = []
        for name in families[family]:
            desc = ctx.description(name)
            lo, hi = ctx.value_range(name)
            rng = f" Range {svg.fmt(lo)} to {svg.fmt(hi)}." if lo is not None and hi is not None else ""
            hint = f" Higher = more {ctx.higher(name)}." if ctx.higher(name) else ""
            details.append(f"- `{name}` ({ctx.label(name)}): {desc}{rng}{hint}".rstrip())
        sec.text(text + "\n\n" + "\n".join(details))
    groups: list[tuple[list[str], tuple]] = []  # consecutive rows with the same shape collapse into one line
    for site, label in zip(ctx.sites, ctx.labels):
        key = (str(site.get("kind", "")), int(site.get("num_heads", 0)), int(site.get("num_kv_heads", 0)),
               int(site.get("head_dim", 0)), str(site.get("positions", "")), "yes" if site.get("causal") else "no",
               "; ".join(site.get("notes") or []))
        if groups and groups[-1][1] == key:
            groups[-1][0].append(label)
        else:
            groups.append(([label], key))
    rows = [[labels[0] if len(labels) == 1 else f"{labels[0]} – {labels[-1]} ({len(labels)})", *key]
            for labels, key in groups]
    sec.heading("Model layout")
    sec.table(rows, ["rows", "kind", "heads", "kv heads", "head dim", "positions", "causal", "notes"])


def _heatmaps(report: Report, ctx: _Context) -> None:
    sec = report.add_section("Per-head metrics", intro=(
        "One heatmap per metric: rows are layers, columns are heads. The legend beside each map gives the scale "
        "and which direction means more specialised or more important."))
    for family, names in ctx.family_metrics().items():
        sec.heading(FAMILY_TITLES[family])
        sec.grid([_metric_heatmap(ctx, name) for name in names])


def _importance(report: Report, ctx: _Context, top: int = 20) -> None:
    names = [n for n in ctx.heads if metric_family(n) == "importance"]
    if not names:
        return
    sec = report.add_section("Most important heads", intro=(
        f"The {top} heads the model relies on most, across all layers, by each importance measure. Heads at the "
        "bottom of the ranking (see the table) are the safest to remove."))
    figures = []
    for name in names:
        ranked = _ranked(ctx.heads[name], ctx.labels)[:top]
        figures.append((svg.bars([v for _, v, _, _ in ranked], [lab for lab, _, _, _ in ranked],
                                 f"Top {len(ranked)} heads: {ctx.label(name)}", sort=True, xlabel=ctx.label(name)),
                        ctx.description(name) or None))
    sec.grid(figures)
    rows = []
    for name in names:
        ranked = _ranked(ctx.heads[name], ctx.labels)
        rows.append([ctx.label(name), ", ".join(lab for lab, *_ in ranked[-10:][::-1])])
    sec.table(rows, ["measure", "10 least important heads (least first)"])


def _extremes(report: Report, ctx: _Context, k: int = 5) -> None:
    sec = report.add_section("Top and bottom heads", intro=(
        f"For every metric, the {k} heads with the highest and the {k} with the lowest value."))
    rows = []
    for name in ctx.heads:
        ranked = _ranked(ctx.heads[name], ctx.labels)
        if not ranked:
            continue
        top = ", ".join(f"{lab} ({svg.fmt(v)})" for lab, v, *_ in ranked[:k])
        bottom = ", ".join(f"{lab} ({svg.fmt(v)})" for lab, v, *_ in ranked[::-1][:k])
        rows.append([ctx.label(name), name, top, bottom])
    sec.table(rows, ["metric", "key", f"highest {k}", f"lowest {k}"])


def _head_list(items: Sequence[tuple[str, float]]) -> str:
    return ", ".join(f"{lab} ({svg.fmt(v, 2)})" for lab, v in items)


def _positional(report: Report, ctx: _Context, threshold: float = 0.5) -> None:
    sec = report.add_section("Positional heads", intro=(
        f"Heads that send more than {threshold:.0%} of their attention to one fixed position relative to the "
        "token: the previous token, the next token or the token itself. Such heads are simple, recognisable "
        "and often cheap to replace with a fixed pattern. Heads are listed strongest first, with their share."))
    patterns = [m for m in ("prev", "next", "self", "special") if m in ctx.heads]
    if not patterns:
        sec.text("The stats file has no positional shares (`prev`, `next`, `self`, `special`).")
        return
    rows = []
    for m in patterns:
        found = [(lab, v) for lab, v, *_ in _ranked(ctx.heads[m], ctx.labels) if v > threshold]
        rows.append([POSITION_WORDS[m], len(found), _head_list(found) or "none"])
    sec.table(rows, ["attends mostly to", "heads", f"heads with more than {threshold:.0%} of their attention there"])
    if "special" in ctx.heads:
        sec.text("Heads that mostly attend to **special tokens** ([CLS], [SEP], <s>, ...) use them as a parking "
                 "spot when they have nothing to do; they are usually idle for most inputs.")


def _histograms(report: Report, ctx: _Context, max_lines: int = 16) -> None:
    hist = ctx.stats.get("histogram")
    if not hist or not hist.get("counts"):
        return
    edges = [float(e) for e in hist["edges"]]
    counts = hist["counts"]
    sec = report.add_section("Attention weight distributions", intro=(
        "How large the individual attention weights are. The x axis is the weight on a log scale (10⁻⁸ to 1); "
        "the y axis is the share of all weights falling in each bin. A head with mass near 1 puts nearly all of "
        "its attention on one token; mass at tiny weights means most tokens are ignored."))
    n_bins = len(edges) - 1
    medians, figures = {}, []
    for r, layer in enumerate(counts[:len(ctx.labels)]):
        heads = {h: [_num(v) for v in c] for h, c in enumerate(layer) if c and len(c) == n_bins}
        heads = {h: c for h, c in heads.items() if None not in c}  # a head without data has no distribution
        if not heads:
            continue
        per_bin = list(zip(*heads.values()))
        median = [_quantile(b, 0.5) for b in per_bin]
        medians[ctx.labels[r]] = median
        title = f"{ctx.labels[r]}: {len(heads)} heads"
        if len(heads) <= max_lines:
            curves = {f"{ctx.labels[r]} H{h}": c for h, c in heads.items()}
            colors = {name: "#8fb8de" for name in curves}
            widths = {name: 1.0 for name in curves}
            figures.append(svg.histogram_lines(edges, {**curves, "median": median}, title, legend=False,
                                               colors={**colors, "median": "#0b3d91"},
                                               widths={**widths, "median": 2.5}, width=300, height=220))
        else:
            band = ([_quantile(b, 0.1) for b in per_bin], [_quantile(b, 0.9) for b in per_bin])
            figures.append(svg.histogram_lines(edges, {"median": median}, title, bands={"10–90% of heads": band},
                                               colors={"median": "#0b3d91", "10–90% of heads": "#0072B2"},
                                               widths={"median": 2.5}, legend=False, width=300, height=220))
    if not medians:
        return
    shown = list(medians)
    shown = shown[::max(1, math.ceil(len(shown) / 12))]
    cm = svg.colormap("viridis")
    colors = {lab: cm(0.88 * i / max(len(shown) - 1, 1)) for i, lab in enumerate(shown)}
    sec.figure(svg.histogram_lines(edges, {lab: medians[lab] for lab in shown}, "Median head per layer",
                                   colors=colors, width=640, height=330),
               "Bin by bin, the median over a layer's heads. Colour runs from the first layer (dark violet) to the "
               "last (yellow-green).")
    sec.heading("Per layer")
    sec.text(f"Thin lines are individual heads (hover one to see which), the bold line their median; layers with "
             f"more than {max_lines} heads show the 10th to 90th percentile of heads as a shaded band instead.")
    sec.grid(figures)


def _similarity(report: Report, ctx: _Context, top_pairs: int = 10) -> None:
    sim = ctx.stats.get("similarity") or {}
    kinds = [(k, t) for k, t in (("attention_cosine", "attention"), ("output_cosine", "output")) if sim.get(k)]
    if not kinds:
        return
    sec = report.add_section("Head similarity", intro=(
        "Cosine similarity between the heads of one layer. *Attention* similarity compares where two heads look; "
        "*output* similarity compares what they write into the residual stream. Values near 1 mean two heads are "
        "nearly redundant (candidates for merging); the diagonal is each head with itself."))
    best = []
    for key, word in kinds:
        pairs = []
        for r, matrix in enumerate(sim[key][:len(ctx.labels)]):
            m = _clean(matrix)
            pairs += [(m[i][j], f"{ctx.labels[r]} H{i}", f"{ctx.labels[r]} H{j}", word)
                      for i in range(len(m)) for j in range(i + 1, len(m[i])) if m[i][j] is not None]
        best += sorted(pairs, reverse=True)[:top_pairs]
    if best:
        sec.table([[a, b, word, v] for v, a, b, word in best], ["head", "head", "similarity of", "cosine"],
                  caption=f"The {top_pairs} most similar pairs of heads by each measure.")
    for key, word in kinds:
        lo, cmap = (0.0, "viridis") if key == "attention_cosine" else (-1.0, "diverging")
        sec.heading(f"{word.capitalize()} cosine, per layer")
        figs = []
        for r, matrix in enumerate(sim[key][:len(ctx.labels)]):
            m = _clean(matrix)
            names = [f"H{h}" for h in range(max((len(x) for x in m), default=0))]
            figs.append(svg.heatmap(m, names, names, f"{ctx.labels[r]}: {word} cosine", lo, 1.0, cmap,
                                    xlabel="head", ylabel="head", legend="cosine", max_width=300))
        sec.grid(figs)


def _example_heads(ctx: _Context, max_layers: int = 12) -> list[tuple[int, int, str]]:
    """``(row, head, why)`` for the attention maps: the most confident head per layer (of at most ``max_layers``
    evenly spaced layers), then the three most important heads."""
    chosen: dict[tuple[int, int], str] = {}
    conf = ctx.confidence_metric()
    n = len(ctx.sites)
    rows = range(n) if n <= max_layers else sorted({round(i * (n - 1) / (max_layers - 1)) for i in range(max_layers)})
    for r in rows:
        row = ctx.heads[conf][r] if conf else []
        valid = [(v, h) for h, v in enumerate(row) if v is not None]
        if valid:
            v, h = max(valid)
            chosen[(r, h)] = f"most confident in {ctx.labels[r]} ({ctx.label(conf)} {svg.fmt(v)})"
        elif not conf:
            chosen[(r, 0)] = f"first head of {ctx.labels[r]}"
    imp = ctx.importance_metric()
    if imp:
        for lab, v, r, h in _ranked(ctx.heads[imp], ctx.labels)[:3]:
            why = f"among the 3 most important ({ctx.label(imp)} {svg.fmt(v)})"
            chosen[(r, h)] = f"{chosen[(r, h)]}; {why}" if (r, h) in chosen else why
    return [(r, h, why) for (r, h), why in sorted(chosen.items())]


def _examples(report: Report, ctx: _Context, max_examples: int, max_tokens: int) -> None:
    examples = [e for e in (ctx.stats.get("examples") or []) if e.get("maps")][:max_examples]
    if not examples:
        return
    sec = report.add_section("Attention maps", intro=(
        "Where selected heads look in example sentences. Each row is a token that is looking (the query), each "
        "column a token it can look at (the key); brighter = more attention. Shown: the most confident head of "
        "every layer and the most important heads overall."))
    selection = _example_heads(ctx)
    for n, ex in enumerate(examples, 1):
        tokens = [str(t) for t in ex.get("tokens") or []]
        cut = len(tokens) > max_tokens
        sec.heading(f"Sentence {n}")
        sec.text(f"“{ex.get('text', '')}” ({len(tokens)} tokens"
                 + (f"; the maps show the first {max_tokens})" if cut else ")"))
        figs = []
        for r, h, why in selection:
            if r >= len(ex["maps"]) or h >= len(ex["maps"][r]):
                continue
            m = [row[:max_tokens] for row in _clean(ex["maps"][r][h])[:max_tokens]]
            rows = tokens[:len(m)] if len(tokens) >= len(m) else [str(i) for i in range(len(m))]
            n_cols = max((len(x) for x in m), default=0)
            cols = tokens[:n_cols] if len(tokens) >= n_cols else [str(i) for i in range(n_cols)]
            hi = max((v for row in m for v in row if v is not None), default=1.0) or 1.0
            figs.append((svg.heatmap(m, rows, cols, f"{ctx.labels[r]} H{h}", 0.0, hi, xlabel="key token",
                                     ylabel="query token", legend="attention weight", max_width=470), why))
        sec.grid(figs)


ROLE_COLOURS = {"positional:prev": svg.PALETTE[0], "positional:next": svg.PALETTE[5], "rare": svg.PALETTE[1],
                "alignment": svg.PALETTE[2], "several": svg.PALETTE[4]}
ROLE_WORDS = {"positional:prev": "positional (previous token)", "positional:next": "positional (next token)",
              "rare": "rare tokens", "alignment": "alignment-like", "several": "several roles"}
KIND_SCORES = {"enc-self": ("prev", "next", "rare"), "dec-self": ("prev", "rare"),
               "dec-enc": ("alignment", "confidence", "rare")}
SCORE_TITLES = {"prev": "argmax on previous token", "next": "argmax on next token", "rare": "argmax on rarest token",
                "alignment": "argmax aligned", "confidence": "mean largest weight"}


def _role_grid(roles: Sequence[Sequence[Sequence[str]]], labels: Sequence[str], title: str, cell: float = 26) -> str:
    """Layers × heads, each cell coloured by the head's role (a categorical heatmap, class ``hw-roles``)."""
    n_cols = max((len(r) for r in roles), default=0)
    left, top = max((len(s) for s in labels), default=1) * svg.CHAR_W + 12, 30
    body = [svg._text(4, 18, title, size=13, weight="600")]
    for i, (row, label) in enumerate(zip(roles, labels)):
        y = top + i * cell
        body.append(svg._text(left - 5, y + cell / 2 + 4, label, anchor="end"))
        for h, found in enumerate(row):
            key = found[0] if len(found) == 1 else ("several" if found else None)
            fill = ROLE_COLOURS.get(key, "#f2f2f2")
            tip = f"{label} H{h}: {', '.join(ROLE_WORDS[f] for f in found) or 'no role'}"
            body.append(f'<rect x="{left + h * cell:.1f}" y="{y:.1f}" width="{cell - 1:.1f}" height="{cell - 1:.1f}" '
                        f'fill="{fill}"><title>{escape(tip)}</title></rect>')
    bottom = top + len(roles) * cell
    for h in range(n_cols):
        body.append(svg._text(left + h * cell + cell / 2, bottom + 12, f"H{h}", size=9, anchor="middle"))
    legend_x = left + n_cols * cell + 14
    for k, (key, colour) in enumerate(ROLE_COLOURS.items()):
        body.append(f'<rect x="{legend_x:.1f}" y="{top + 16 * k:.1f}" width="11" height="11" fill="{colour}"/>')
        body.append(svg._text(legend_x + 16, top + 16 * k + 10, ROLE_WORDS[key], size=10))
    width = legend_x + 16 + max(len(w) for w in ROLE_WORDS.values()) * svg.CHAR_W
    return svg._svg("hw-roles", width, max(bottom + 20, top + 16 * len(ROLE_COLOURS)) + 4, title, body)


def add_roles_section(report: Report, roles: dict) -> None:
    """Voita's head roles per attention kind (``roles``: ``headwise.analysis.roles.HeadRoles.to_dict()``): for each
    kind a table of the heads holding each role, a layer × head grid coloured by role and the role scores."""
    if roles.get("headwise_roles") != 1:
        raise HeadwiseError("not a head-roles result (expected \"headwise_roles\": 1); compute one with "
                            "headwise.analysis.roles.head_roles")
    cfg = roles["config"]
    sec = report.add_section("Head roles", intro=(
        "Roles after Voita et al. (2019), from the key each token gives its largest weight (its argmax). "
        f"**Positional**: the argmax is the previous (or next) token for at least {cfg['positional_threshold']:.0%} "
        f"of the tokens. **Rare tokens**: the argmax is the sentence's least frequent token for at least "
        f"{cfg['rare_threshold']:.0%} of the tokens (frequencies: {roles['frequency_source']}). **Alignment-like** "
        f"(decoder→encoder only, {roles['alignment_source']}): the argmax is the aligned source token — or, "
        f"without an alignment, lies within {cfg['diagonal_window']} token(s) of the diagonal — for at least "
        f"{cfg['alignment_threshold']:.0%} of the target tokens"
        + ("" if roles["alignment_source"] == "given alignment" else
           f", with a mean largest weight of at least {cfg['alignment_confidence']:.0%}") + "."))
    by_kind = roles.get("by_kind") or {}
    for kind in KINDS:
        index = [i for i, s in enumerate(roles["sites"]) if s["kind"] == kind]
        if not index:
            continue
        labels = [f"L{roles['sites'][i]['layers'][0]}" for i in index]
        sec.heading(f"{kind} ({len(index)} layers)")
        found = by_kind.get(kind, {})
        found = {role: found[role] for role in ROLE_WORDS if role in found}
        sec.table([[ROLE_WORDS[role], len(heads), ", ".join(heads)] for role, heads in found.items()]
                  or [["none", 0, "no head reaches a role threshold"]], ["role", "heads", "which"])
        figures = [(_role_grid([roles["roles"][i] for i in index], labels, f"{kind}: roles"), None)]
        for name in KIND_SCORES[kind]:
            table = _clean([roles["scores"][name][i] for i in index])
            figures.append(svg.heatmap(table, labels, [f"H{h}" for h in range(max(len(r) for r in table))],
                                       f"{kind}: {SCORE_TITLES[name]}", 0.0, 1.0, xlabel="head", ylabel="layer",
                                       legend="share of tokens", max_width=360))
        sec.grid(figures)


def analysis_report(stats: dict, *, max_examples: int = 2, max_tokens: int = 32) -> Report:
    """Build the standard per-head analysis report from a stats dict (the contents of ``stats.json``).

    Sections: how to read the page, a heatmap of every metric, importance rankings, top/bottom heads,
    positional heads, attention-weight histograms, head similarity and example attention maps (the last
    three only when the stats contain them), and head roles per kind when ``stats["roles"]`` holds a
    ``HeadRoles.to_dict()``. Raises :class:`HeadwiseError` for malformed stats.
    """
    ctx = _Context(stats)
    n_heads = sum(len(row) for row in next(iter(ctx.heads.values()), []))
    n_heads = n_heads or sum(int(s.get("num_heads", 0)) for s in ctx.sites)
    kinds = sorted({str(s.get("kind", "")) for s in ctx.sites})
    meta = {"model": stats.get("model") or "?", "data": stats.get("data") or "(not recorded)",
            "sentences": f"{int(stats.get('sentences', 0)):,}", "tokens": f"{int(stats.get('tokens', 0)):,}",
            "layers": len(ctx.sites), "heads": n_heads, "attention": ", ".join(kinds)}
    from ..version import __version__

    report = Report(f"Attention heads of {short_model_name(str(stats.get('model') or 'a model'))}",
                    subtitle="Which heads matter, what they do, and which ones look redundant.", meta=meta,
                    footer=f"Generated by headwise {__version__} from a stats file (format 1).")
    _verdict(report, ctx)
    _overview(report, ctx)
    _heatmaps(report, ctx)
    _importance(report, ctx)
    _extremes(report, ctx)
    _positional(report, ctx)
    _histograms(report, ctx)
    _similarity(report, ctx)
    _examples(report, ctx, max_examples, max_tokens)
    if stats.get("roles"):
        add_roles_section(report, stats["roles"])
    return report


def write_report(stats: dict, out_dir: str | os.PathLike, overwrite: bool = False) -> Path:
    """Build the analysis report from ``stats`` and write ``out_dir/report.html``; returns that path."""
    return analysis_report(stats).write(out_dir, overwrite=overwrite)
