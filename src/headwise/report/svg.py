"""Inline SVG figures as plain strings: heatmaps, bar charts, line plots and histogram curves.

Every function is pure (numbers in, an ``<svg>`` string out), escapes all text it is given, uses no
external fonts, scripts or style sheets, and tags its root element with a CSS class
(``hw-heatmap``, ``hw-bars``, ``hw-lines``, ``hw-hist``) so pages and tests can find the figures.
Missing values (``None``, NaN, or absent cells of ragged rows) are drawn as hatched grey cells or gaps.
"""

from __future__ import annotations

import math
from html import escape
from typing import Callable, Mapping, Sequence

Number = float | int | None
RGB = tuple[float, float, float]

FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"
CHAR_W = 6.4  # rough width in px of one character at font-size 11
TITLE_W = 7.9  # the same for the bold 13px figure titles
MISSING_FILL = "#e4e4e4"

# Anchor colours; the colormaps interpolate linearly between them.
# Sequential: dark blue-violet -> teal -> green -> yellow, lightness rising monotonically (viridis-like).
_SEQUENTIAL: list[RGB] = [
    (0.267, 0.005, 0.329), (0.283, 0.141, 0.458), (0.254, 0.265, 0.530), (0.207, 0.372, 0.553),
    (0.164, 0.471, 0.558), (0.128, 0.567, 0.551), (0.135, 0.659, 0.518), (0.267, 0.749, 0.441),
    (0.478, 0.821, 0.318), (0.741, 0.873, 0.150), (0.993, 0.906, 0.144),
]
# Diverging: blue (low) -> near-white (centre) -> red (high), symmetric in lightness.
_DIVERGING: list[RGB] = [
    (0.020, 0.188, 0.380), (0.129, 0.400, 0.675), (0.404, 0.663, 0.812), (0.820, 0.898, 0.941),
    (0.969, 0.969, 0.969), (0.992, 0.859, 0.780), (0.937, 0.541, 0.384), (0.698, 0.094, 0.169),
    (0.404, 0.000, 0.122),
]
COLORMAPS: dict[str, list[RGB]] = {"viridis": _SEQUENTIAL, "sequential": _SEQUENTIAL, "diverging": _DIVERGING}
# Okabe-Ito: distinguishable for the common kinds of colour blindness.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000", "#999933", "#882255",
           "#44AA99"]

# ---------------------------------------------------------------------------------------------- helpers


def is_missing(value: object) -> bool:
    """True for ``None`` and NaN: values drawn as gaps."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def fmt(value: Number, digits: int = 3) -> str:
    """A short human number: ``0.123``, ``12.3``, ``1.2e-05``; ``n/a`` when missing."""
    if is_missing(value):
        return "n/a"
    v = float(value)
    if v == 0:
        return "0"
    if 1e3 <= abs(v) < 1e5:
        return f"{v:.0f}"
    return f"{v:.{digits}g}".replace("e-0", "e-").replace("e+0", "e+")


def short(value: Number) -> str:
    """At most five characters for a value printed inside a heatmap cell: ``0.67``, ``12.3``, ``2e-3``."""
    if is_missing(value):
        return ""
    v = float(value)
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 1e4 or a < 0.01:
        mant, exp = f"{v:.0e}".split("e")
        return f"{mant}e{int(exp)}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def _rgb_hex(rgb: RGB) -> str:
    return "#" + "".join(f"{max(0, min(255, round(c * 255))):02x}" for c in rgb)


def colormap(name: str) -> Callable[[float], str]:
    """A function mapping ``t`` in [0, 1] (clipped) to a ``#rrggbb`` colour of the named map."""
    if name not in COLORMAPS:
        raise ValueError(f"unknown colormap {name!r}; choose one of {sorted(COLORMAPS)}")
    anchors = COLORMAPS[name]

    def at(t: float) -> str:
        t = 0.0 if is_missing(t) else min(1.0, max(0.0, float(t)))
        pos = t * (len(anchors) - 1)
        i = min(int(pos), len(anchors) - 2)
        f = pos - i
        a, b = anchors[i], anchors[i + 1]
        return _rgb_hex(tuple(x + (y - x) * f for x, y in zip(a, b)))  # type: ignore[arg-type]

    return at


def luminance(hex_colour: str) -> float:
    """Relative luminance (WCAG) of a ``#rrggbb`` colour, 0 (black) to 1 (white)."""
    def lin(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b)


def value_color(value: Number, vmin: float, vmax: float, cmap: str = "viridis") -> str:
    """Colour of ``value`` on a ``cmap`` scale from ``vmin`` to ``vmax``; grey when missing."""
    if is_missing(value):
        return MISSING_FILL
    span = vmax - vmin
    t = 0.5 if span <= 0 else (float(value) - vmin) / span
    return colormap(cmap)(t)


def _finite(values: Sequence[Number]) -> list[float]:
    return [float(v) for v in values if not is_missing(v) and math.isfinite(float(v))]


def _range(values: Sequence[Number], vmin: float | None, vmax: float | None) -> tuple[float, float]:
    vals = _finite(values)
    lo = vmin if vmin is not None else (min(vals) if vals else 0.0)
    hi = vmax if vmax is not None else (max(vals) if vals else 1.0)
    if hi < lo:
        lo, hi = hi, lo
    return float(lo), float(hi)


def _clip_label(label: str, n: int) -> str:
    return label if len(label) <= n else label[: n - 1] + "…"


def _text(x: float, y: float, s: str, *, size: float = 11, anchor: str = "start", weight: str = "normal",
          fill: str = "#222", extra: str = "") -> str:
    attrs = f' text-anchor="{anchor}"' if anchor != "start" else ""
    attrs += f' font-weight="{weight}"' if weight != "normal" else ""
    return f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" fill="{fill}"{attrs}{extra}>{escape(s)}</text>'


def _svg(cls: str, width: float, height: float, title: str, body: list[str]) -> str:
    w, h = math.ceil(max(width, len(title) * TITLE_W + 10)), math.ceil(height)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="hw-fig {cls}" width="{w}" height="{h}" '
            f'viewBox="0 0 {w} {h}" role="img" aria-label="{escape(title)}" font-family="{escape(FONT)}">'
            f"<title>{escape(title)}</title>" + "".join(body) + "</svg>")


def _hatch_defs() -> str:
    # Pattern ids are shared by every figure; each definition is identical, so duplicates are harmless.
    return ('<defs><pattern id="hw-missing" width="6" height="6" patternUnits="userSpaceOnUse" '
            'patternTransform="rotate(45)"><rect width="6" height="6" fill="#eeeeee"/>'
            '<line x1="0" y1="0" x2="0" y2="6" stroke="#c8c8c8" stroke-width="2"/></pattern></defs>')


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering [lo, hi] (steps of 1, 2 or 5 times a power of ten)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi == lo:
        return [lo]
    raw = (hi - lo) / max(n - 1, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step - 1e-9) * step
    ticks, v = [], start
    while v <= hi + step * 1e-9:
        ticks.append(round(v, 12))
        v += step
    return ticks


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def _pow10_label(exp: int) -> str:
    if exp == 0:
        return "1"
    if exp == 1:
        return "10"
    return "10" + str(exp).translate(_SUPERSCRIPT)


def log_ticks(lo: float, hi: float, max_ticks: int = 6) -> list[tuple[float, str]]:
    """Powers of ten within [lo, hi] (every k-th decade so at most ``max_ticks``), with labels like 10⁻⁶."""
    if lo <= 0 or hi <= 0 or not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    a, b = math.ceil(math.log10(lo) - 1e-9), math.floor(math.log10(hi) + 1e-9)
    if b - a + 1 >= 3:
        every = max(1, math.ceil((b - a + 1) / max_ticks))
        return [(10.0 ** e, _pow10_label(e)) for e in range(b, a - 1, -every)][::-1]
    # Less than three decades: add 2x and 5x steps, labelled as plain numbers.
    ticks = [m * 10.0 ** e for e in range(a - 1, b + 1) for m in (1, 2, 5)]
    return [(t, fmt(t)) for t in ticks if lo * (1 - 1e-9) <= t <= hi * (1 + 1e-9)]


# ---------------------------------------------------------------------------------------------- heatmap


def _colorbar(x: float, y: float, height: float, vmin: float, vmax: float, cmap: str, label: str) -> list[str]:
    """A vertical colour bar at (x, y) with min / mid / max values and an optional label."""
    cm, steps, w = colormap(cmap), 48, 12
    out = []
    for i in range(steps):
        t = 1 - (i + 0.5) / steps
        out.append(f'<rect x="{x:.1f}" y="{y + i * height / steps:.2f}" width="{w}" '
                   f'height="{height / steps + 0.6:.2f}" fill="{cm(t)}"/>')
    out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w}" height="{height:.1f}" fill="none" stroke="#888" '
               f'stroke-width="0.5"/>')
    for frac, val in ((0.0, vmax), (0.5, (vmin + vmax) / 2), (1.0, vmin)):
        ty = y + frac * height
        out.append(f'<line x1="{x + w}" y1="{ty:.1f}" x2="{x + w + 3}" y2="{ty:.1f}" stroke="#666"/>')
        out.append(_text(x + w + 5, ty + 4, fmt(val), size=10, fill="#444"))
    if label:
        out.append(_text(x, y - 7, label, size=10, fill="#555"))
    return out


def _axis_labels(xlabel: str, ylabel: str, x_at: tuple[float, float], y_at: tuple[float, float]) -> list[str]:
    """Axis titles: ``xlabel`` centred at ``x_at``, ``ylabel`` rotated at ``y_at``."""
    out = []
    if xlabel:
        out.append(_text(*x_at, xlabel, size=11, anchor="middle", fill="#555"))
    if ylabel:
        out.append(_text(*y_at, ylabel, size=11, anchor="middle", fill="#555",
                         extra=f' transform="rotate(-90 {y_at[0]} {y_at[1]:.1f})"'))
    return out


def heatmap(matrix: Sequence[Sequence[Number]], row_labels: Sequence[str], col_labels: Sequence[str],
            title: str, vmin: float | None = None, vmax: float | None = None, cmap: str = "viridis", *,
            xlabel: str = "", ylabel: str = "", legend: str = "", cell: float | None = None,
            annotate: bool | None = None, max_width: float = 620) -> str:
    """A heatmap with row/column labels, a colour legend and a tooltip (exact value) per cell.

    ``matrix`` may be ragged: rows shorter than the longest one show hatched "no head" cells. ``vmin`` /
    ``vmax`` default to the data range. ``annotate`` prints values in the cells (default: when they fit).
    """
    rows = [list(r) for r in matrix]
    n_rows = len(rows)
    n_cols = max((len(r) for r in rows), default=0)
    row_labels = [str(x) for x in row_labels] + [str(i) for i in range(len(row_labels), n_rows)]
    col_labels = [str(x) for x in col_labels] + [str(i) for i in range(len(col_labels), n_cols)]
    lo, hi = _range([v for r in rows for v in r], vmin, vmax)
    if cell is None:
        cell = max(9.0, min(30.0, (max_width - 170) / max(n_cols, 1), 520 / max(n_rows, 1) + 6))
    if annotate is None:
        annotate = cell >= 28
    font = 11 if cell >= 13 else 9
    cw = CHAR_W * font / 11
    rlabels = [_clip_label(s, 16) for s in row_labels[:n_rows]]
    clabels = [_clip_label(s, 14) for s in col_labels[:n_cols]]
    left = max((len(s) for s in rlabels), default=1) * cw + 10 + (16 if ylabel else 0)
    rotate = any(len(s) * cw > cell - 2 for s in clabels)
    label_h = (max((len(s) for s in clabels), default=1) * cw + 6) if rotate else font + 6
    top = 46 if legend else 30
    grid_w, grid_h = n_cols * cell, n_rows * cell
    bottom = top + grid_h + label_h + (18 if xlabel else 4)
    legend_x = left + grid_w + 14
    width = max(legend_x + 64, legend_x + len(legend) * CHAR_W * 10 / 11 + 4)
    height = max(bottom, top + 90) + 4

    body = [_hatch_defs(), _text(4, 18, title, size=13, weight="600")]
    for i, row in enumerate(rows):
        y = top + i * cell
        for j in range(n_cols):
            x = left + j * cell
            if j >= len(row):
                tip = f"{row_labels[i]}, {col_labels[j]}: no head here"
                body.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{cell:.1f}" height="{cell:.1f}" '
                            f'fill="url(#hw-missing)"><title>{escape(tip)}</title></rect>')
                continue
            v = row[j]
            fill = "url(#hw-missing)" if is_missing(v) else value_color(v, lo, hi, cmap)
            tip = f"{row_labels[i]}, {col_labels[j]}: {fmt(v, 4)}"
            body.append(f'<rect class="hw-cell" x="{x:.1f}" y="{y:.1f}" width="{cell + 0.3:.1f}" '
                        f'height="{cell + 0.3:.1f}" fill="{fill}"><title>{escape(tip)}</title></rect>')
            if annotate and not is_missing(v):
                ink = "#111" if luminance(fill) > 0.35 else "#fff"
                body.append(_text(x + cell / 2, y + cell / 2 + 3.5, short(v), size=9, anchor="middle", fill=ink,
                                  extra=' pointer-events="none"'))
    body.append(f'<rect x="{left:.1f}" y="{top}" width="{grid_w:.1f}" height="{grid_h:.1f}" fill="none" '
                f'stroke="#999" stroke-width="0.6"/>')
    for i, s in enumerate(rlabels):
        body.append(_text(left - 5, top + i * cell + cell / 2 + font * 0.35, s, size=font, anchor="end"))
    for j, s in enumerate(clabels):
        cx = left + j * cell + cell / 2
        if rotate:
            ly = top + grid_h + 5
            body.append(_text(cx + font * 0.35, ly, s, size=font, anchor="end",
                              extra=f' transform="rotate(-90 {cx + font * 0.35:.1f} {ly:.1f})"'))
        else:
            body.append(_text(cx, top + grid_h + font + 3, s, size=font, anchor="middle"))
    body += _axis_labels(xlabel, ylabel, (left + grid_w / 2, bottom - 4), (12, top + grid_h / 2))
    body += _colorbar(legend_x, top, max(min(grid_h, 220), 80), lo, hi, cmap, legend)
    return _svg("hw-heatmap", width, height, title, body)


# ---------------------------------------------------------------------------------------------- bars


def bars(values: Sequence[Number], labels: Sequence[str], title: str, *, sort: bool = False,
         top: int | None = None, xlabel: str = "", color: str = "#0072B2", width: float = 560) -> str:
    """Horizontal bars, one per label, with the value printed at each bar's end.

    ``sort`` orders bars from the largest value down; ``top`` keeps only the first ``top`` bars (after sorting).
    Negative values grow to the left of a zero line. Missing values show as "n/a" without a bar.
    """
    items = list(zip([str(s) for s in labels], values))
    if sort:
        items.sort(key=lambda kv: -math.inf if is_missing(kv[1]) else float(kv[1]), reverse=True)
    if top is not None:
        items = items[:top]
    vals = _finite([v for _, v in items])
    lo, hi = min(vals + [0.0]), max(vals + [0.0])
    if hi == lo:
        hi = lo + 1
    ticks = nice_ticks(lo, hi, 5)
    step = ticks[1] - ticks[0] if len(ticks) > 1 else hi - lo
    lo, hi = math.floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step  # end on round ticks
    bar_h, gap, font = 16, 4, 11
    left = max((len(_clip_label(s, 24)) for s, _ in items), default=4) * CHAR_W + 12
    right = 56
    plot_w = max(width - left - right, 120)
    top_y = 30
    height = top_y + len(items) * (bar_h + gap) + (36 if xlabel else 22)

    def x_of(v: float) -> float:
        return left + (v - lo) / (hi - lo) * plot_w

    body = [_text(4, 18, title, size=13, weight="600")]
    for t in nice_ticks(lo, hi, 5):
        x = x_of(t)
        body.append(f'<line x1="{x:.1f}" y1="{top_y - 4}" x2="{x:.1f}" y2="{height - (30 if xlabel else 18)}" '
                    f'stroke="#e6e6e6"/>')
        body.append(_text(x, height - (18 if xlabel else 6), fmt(t), size=10, anchor="middle", fill="#555"))
    zero = x_of(0.0)
    for i, (label, v) in enumerate(items):
        y = top_y + i * (bar_h + gap)
        body.append(_text(left - 6, y + bar_h / 2 + 4, _clip_label(label, 24), size=font, anchor="end"))
        if is_missing(v):
            body.append(_text(zero + 4, y + bar_h / 2 + 4, "n/a", size=10, fill="#777"))
            continue
        x0, x1 = sorted((zero, x_of(float(v))))
        body.append(f'<rect class="hw-bar" x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 0.5):.1f}" height="{bar_h}" '
                    f'fill="{color}"><title>{escape(label)}: {escape(fmt(v, 4))}</title></rect>')
        body.append(_text(x1 + 4 if float(v) >= 0 else x0 - 4, y + bar_h / 2 + 4, fmt(v), size=10, fill="#333",
                          anchor="start" if float(v) >= 0 else "end"))
    body.append(f'<line x1="{zero:.1f}" y1="{top_y - 4}" x2="{zero:.1f}" y2="{height - (30 if xlabel else 18)}" '
                f'stroke="#555"/>')
    if xlabel:
        body.append(_text(left + plot_w / 2, height - 3, xlabel, size=11, anchor="middle", fill="#555"))
    return _svg("hw-bars", width, height, title, body)


# ---------------------------------------------------------------------------------------------- line plots


def _xy_plot(cls: str, series: Mapping[str, tuple[Sequence[Number], Sequence[Number]]], title: str, xlabel: str,
             ylabel: str, *, logx: bool, logy: bool, bands: Mapping[str, tuple[Sequence[Number], Sequence[Number],
             Sequence[Number]]] | None, colors: Mapping[str, str] | None, markers: bool, width: float,
             height: float, ylim: tuple[float | None, float | None], widths: Mapping[str, float] | None,
             xlim: tuple[float | None, float | None] = (None, None), legend: bool = True) -> str:
    """Shared machinery of :func:`lines` and :func:`histogram_lines`."""
    colors = dict(colors or {})
    names = list(series) + [n for n in (bands or {}) if n not in series]
    for i, name in enumerate(names):
        colors.setdefault(name, PALETTE[i % len(PALETTE)])

    def ok(v: Number, log: bool) -> bool:
        return not is_missing(v) and math.isfinite(float(v)) and (not log or float(v) > 0)

    xs_all = [float(x) for xs, _ in series.values() for x in xs if ok(x, logx)]
    ys_all = [float(y) for _, ys in series.values() for y in ys if ok(y, logy)]
    for bx, blo, bhi in (bands or {}).values():
        xs_all += [float(x) for x in bx if ok(x, logx)]
        ys_all += [float(y) for y in list(blo) + list(bhi) if ok(y, logy)]
    x0, x1 = (min(xs_all), max(xs_all)) if xs_all else (0.0, 1.0)
    y0, y1 = (min(ys_all), max(ys_all)) if ys_all else (0.0, 1.0)
    if not logy and ylim[0] is None and y0 > 0 and y0 < 0.5 * y1:
        y0 = 0.0  # start at zero when that does not squash the data
    y0 = ylim[0] if ylim[0] is not None else y0
    x0 = xlim[0] if xlim[0] is not None else x0
    x1 = xlim[1] if xlim[1] is not None else x1
    y1 = ylim[1] if ylim[1] is not None else y1
    if x1 == x0:
        x0, x1 = (x0 / 2, x0 * 2) if logx else (x0 - 1, x1 + 1)
    if y1 == y0:
        y0, y1 = (y0 / 2, y0 * 2) if logy else (y0 - 1, y1 + 1)
    # A little air around the data so end points and markers are not cut by the frame.
    if xlim == (None, None):
        x0, x1 = _pad(x0, x1, logx)
    if ylim[1] is None:
        y0, y1 = _pad(y0, y1, logy, lower=ylim[0] is None)

    show_legend = legend and (len(names) > 1 or bool(bands))
    legend_w = max((len(n) for n in names), default=0) * CHAR_W * 10 / 11 + 34 if show_legend else 0
    left, right, top, bottom = 56, 14 + legend_w, 30, 44
    pw, ph = width - left - right, height - top - bottom
    tx = (lambda v: math.log10(v)) if logx else float
    ty = (lambda v: math.log10(v)) if logy else float
    X0, X1, Y0, Y1 = tx(x0), tx(x1), ty(y0), ty(y1)

    def px(v: float) -> float:
        return left + (tx(v) - X0) / (X1 - X0) * pw

    def py(v: float) -> float:
        return top + ph - (ty(v) - Y0) / (Y1 - Y0) * ph

    body = [_text(4, 18, title, size=13, weight="600")]
    xt = log_ticks(x0, x1) if logx else [(t, fmt(t)) for t in nice_ticks(x0, x1, 6)]
    yt = log_ticks(y0, y1, 5) if logy else [(t, fmt(t)) for t in nice_ticks(y0, y1, 5)]
    for t, s in xt:
        x = px(t)
        body.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + ph}" stroke="#ececec"/>')
        body.append(_text(x, top + ph + 15, s, size=10, anchor="middle", fill="#555"))
    for t, s in yt:
        y = py(t)
        body.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="#ececec"/>')
        body.append(_text(left - 5, y + 3.5, s, size=10, anchor="end", fill="#555"))
    body.append(f'<rect x="{left}" y="{top}" width="{pw:.1f}" height="{ph:.1f}" fill="none" stroke="#999" '
                f'stroke-width="0.6"/>')
    body.append(f'<svg x="{left}" y="{top}" width="{pw:.1f}" height="{ph:.1f}" '
                f'viewBox="{left} {top} {pw:.1f} {ph:.1f}" overflow="hidden">')
    for name, (bx, blo, bhi) in (bands or {}).items():
        pts = [(px(float(x)), py(float(a)), py(float(b))) for x, a, b in zip(bx, blo, bhi)
               if ok(x, logx) and ok(a, logy) and ok(b, logy)]
        if pts:
            poly = [f"{x:.1f},{a:.1f}" for x, a, _ in pts] + [f"{x:.1f},{b:.1f}" for x, _, b in reversed(pts)]
            body.append(f'<polygon points="{" ".join(poly)}" fill="{colors[name]}" fill-opacity="0.18" '
                        f'stroke="none"><title>{escape(name)}</title></polygon>')
    for name, (xs, ys) in series.items():
        pts = [(float(x), float(y)) for x, y in zip(xs, ys) if ok(x, logx) and ok(y, logy)]
        if not pts:
            continue
        sw = (widths or {}).get(name, 2.0)
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        body.append(f'<polyline points="{path}" fill="none" stroke="{colors[name]}" stroke-width="{sw}" '
                    f'stroke-linejoin="round"><title>{escape(name)}</title></polyline>')
        if markers and len(pts) <= 40:
            for x, y in pts:
                body.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{colors[name]}">'
                            f'<title>{escape(f"{name}: x={fmt(x, 4)}, y={fmt(y, 4)}")}</title></circle>')
    body.append("</svg>")
    body += _axis_labels(xlabel, ylabel, (left + pw / 2, height - 8), (13, top + ph / 2))
    if legend_w:
        lx, ly = left + pw + 12, top + 6
        for i, name in enumerate(names):
            y = ly + i * 16
            if name in series:
                body.append(f'<line x1="{lx}" y1="{y}" x2="{lx + 16}" y2="{y}" stroke="{colors[name]}" '
                            f'stroke-width="3"/>')
            else:
                body.append(f'<rect x="{lx}" y="{y - 5}" width="16" height="10" fill="{colors[name]}" '
                            f'fill-opacity="0.25"/>')
            body.append(_text(lx + 22, y + 4, name, size=10))
    return _svg(cls, width, height, title, body)


def _pad(lo: float, hi: float, log: bool, frac: float = 0.04, lower: bool = True) -> tuple[float, float]:
    if log:
        f = (hi / lo) ** frac
        return (lo / f if lower else lo), hi * f
    d = (hi - lo) * frac
    return (lo - d if lower else lo), hi + d


def lines(series: Mapping[str, tuple[Sequence[Number], Sequence[Number]]], xlabel: str, ylabel: str, title: str, *,
          logx: bool = False, logy: bool = False, colors: Mapping[str, str] | None = None, markers: bool = True,
          ylim: tuple[float | None, float | None] = (None, None), legend: bool = True, width: float = 560,
          height: float = 320) -> str:
    """Line plot of named ``(xs, ys)`` series, e.g. a quality-versus-heads-removed trade-off curve per method.

    Points with missing coordinates (or non-positive ones on a log axis) are skipped. ``legend=False`` drops
    the legend (each line still names itself in a tooltip).
    """
    return _xy_plot("hw-lines", series, title, xlabel, ylabel, logx=logx, logy=logy, bands=None, colors=colors,
                    markers=markers, width=width, height=height, ylim=ylim, widths=None, legend=legend)


def histogram_lines(edges: Sequence[float], curves: Mapping[str, Sequence[Number]], title: str, *,
                    log_x: bool = True, bands: Mapping[str, tuple[Sequence[Number], Sequence[Number]]] | None = None,
                    xlabel: str = "attention weight", ylabel: str = "share of weights",
                    colors: Mapping[str, str] | None = None, widths: Mapping[str, float] | None = None,
                    legend: bool = True, width: float = 380, height: float = 250) -> str:
    """Histograms drawn as curves over bin centres (geometric centres on a log x axis).

    ``curves`` maps a name to one value per bin (``len(edges) - 1``); ``bands`` maps a name to a
    ``(low, high)`` pair of such lists, drawn as a shaded area (e.g. the 10th-90th percentile across heads).
    """
    if len(edges) < 2:
        raise ValueError("histogram_lines needs at least two bin edges")
    centres = [math.sqrt(a * b) if log_x and a > 0 and b > 0 else (a + b) / 2 for a, b in zip(edges, edges[1:])]
    series = {}
    for name, ys in curves.items():
        if len(ys) != len(centres):
            raise ValueError(f"curve {name!r} has {len(ys)} values for {len(centres)} bins")
        series[name] = (centres, ys)
    band_xy = {name: (centres, lo, hi) for name, (lo, hi) in (bands or {}).items()}
    return _xy_plot("hw-hist", series, title, xlabel, ylabel, logx=log_x, logy=False, bands=band_xy, colors=colors,
                    markers=False, width=width, height=height, ylim=(0.0, None), widths=widths,
                    xlim=(edges[0] if edges[0] > 0 or not log_x else None, edges[-1]), legend=legend)
