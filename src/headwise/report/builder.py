"""A self-contained HTML page built from sections of text, figures and tables.

``Report(title).add_section("Heads").figure(svg, "caption")`` ... ``report.write(out_dir)``. The page has no
external resources (fonts, scripts, style sheets), so it opens offline and can be mailed as one file. A tiny
inline script records script errors in ``<html data-hw-errors>`` and sets ``data-hw-ready="1"`` once loaded,
which the browser test reads back.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Iterable, Sequence

from ..errors import HeadwiseError
from ..io.files import atomic_write_text

REPORT_FILE = "report.html"

CSS = """
:root { --ink:#1f2328; --muted:#57606a; --line:#d8dee4; --bg:#ffffff; --panel:#f6f8fa; --accent:#0b5fbf; }
* { box-sizing: border-box; }
html { background: var(--bg); }
body { margin: 0; color: var(--ink); font: 15px/1.55 system-ui, -apple-system, "Segoe UI", Roboto,
       "Helvetica Neue", Arial, sans-serif; }
.hw-page { max-width: 1280px; margin: 0 auto; padding: 24px 32px 64px; }
header.hw-header { border-bottom: 1px solid var(--line); padding-bottom: 12px; margin-bottom: 16px; }
header.hw-header h1 { margin: 0 0 6px; font-size: 28px; }
.hw-subtitle { color: var(--muted); margin: 0 0 10px; }
dl.hw-meta { display: flex; flex-wrap: wrap; gap: 6px 22px; margin: 0; }
dl.hw-meta div { display: flex; gap: 6px; }
dl.hw-meta dt { color: var(--muted); }
dl.hw-meta dd { margin: 0; font-weight: 600; }
nav.hw-toc { background: var(--panel); border: 1px solid var(--line); border-radius: 6px; padding: 10px 18px;
             margin: 0 0 24px; }
nav.hw-toc h2 { font-size: 14px; text-transform: uppercase; letter-spacing: .05em; color: var(--muted);
                margin: 0 0 4px; }
nav.hw-toc ol { margin: 0; padding-left: 22px; columns: 2; column-gap: 40px; }
nav.hw-toc a { color: var(--accent); text-decoration: none; }
nav.hw-toc a:hover { text-decoration: underline; }
section.hw-section { margin: 0 0 36px; }
section.hw-section > h2 { font-size: 22px; border-bottom: 1px solid var(--line); padding-bottom: 4px;
                          margin: 28px 0 10px; }
section.hw-section h3 { font-size: 17px; margin: 22px 0 8px; }
.hw-intro { color: var(--muted); max-width: 900px; }
.hw-text { max-width: 900px; }
.hw-text p { margin: 6px 0 10px; }
code { background: var(--panel); padding: 1px 4px; border-radius: 3px; font-size: 90%; }
figure.hw-figure { margin: 10px 0 18px; display: inline-block; vertical-align: top; max-width: 100%; }
figure.hw-figure svg { max-width: 100%; height: auto; display: block; }
figure.hw-figure figcaption { color: var(--muted); font-size: 13px; max-width: 620px; margin-top: 4px; }
.hw-grid { display: flex; flex-wrap: wrap; gap: 8px 22px; align-items: flex-start; }
.hw-grid figure.hw-figure { margin: 4px 0 10px; }
.hw-grid figure.hw-figure figcaption { max-width: 380px; }
table.hw-table { border-collapse: collapse; margin: 8px 0 18px; font-size: 14px; }
table.hw-table caption { text-align: left; color: var(--muted); font-size: 13px; padding-bottom: 4px; }
table.hw-table th, table.hw-table td { border: 1px solid var(--line); padding: 4px 10px; text-align: left;
                                       vertical-align: top; }
table.hw-table th { background: var(--panel); font-weight: 600; }
table.hw-table td.hw-num { text-align: right; font-variant-numeric: tabular-nums; }
footer.hw-footer { color: var(--muted); font-size: 12px; border-top: 1px solid var(--line); padding-top: 8px; }
"""

# Runs before anything else: records script errors, then marks the page ready once loaded.
SCRIPT = """
(function () {
  var root = document.documentElement, errors = [];
  function note(msg) { errors.push(String(msg)); root.setAttribute("data-hw-errors", errors.join(" | ")); }
  window.addEventListener("error", function (e) { note(e.message || "resource failed to load"); }, true);
  window.addEventListener("unhandledrejection", function (e) { note("unhandled rejection: " + e.reason); });
  var original = console.error;
  console.error = function () { note(Array.prototype.join.call(arguments, " ")); original.apply(console, arguments); };
  window.addEventListener("load", function () { root.setAttribute("data-hw-ready", "1"); });
})();
"""


def slugify(text: str) -> str:
    """A lower-case ``a-z0-9-`` anchor name for ``text`` (``"sec"`` when nothing is left)."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "sec"


def _inline(text: str) -> str:
    """Escape ``text`` and apply inline markup: ``**bold**``, ``*italic*``, `` `code` ``."""
    parts = re.split(r"(`[^`]+`)", text)
    out = []
    for part in parts:
        if part.startswith("`") and part.endswith("`") and len(part) > 1:
            out.append(f"<code>{escape(part[1:-1])}</code>")
            continue
        s = escape(part)
        s = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", s)
        s = re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"<em>\1</em>", s)
        out.append(s)
    return "".join(out)


def markdown_light(text: str) -> str:
    """A small Markdown subset to HTML: paragraphs (blank-line separated), ``- `` bullet lists, inline markup.

    Everything is escaped first, so text from models or data (``<s>``, ``&``) is shown literally.
    """
    blocks = [b for b in re.split(r"\n\s*\n", text.strip()) if b.strip()]
    html = []
    for block in blocks:
        lines = [ln.strip() for ln in block.strip().splitlines()]
        if all(ln.startswith(("- ", "* ")) for ln in lines):
            html.append("<ul>" + "".join(f"<li>{_inline(ln[2:])}</li>" for ln in lines) + "</ul>")
        else:
            html.append(f"<p>{_inline(' '.join(lines))}</p>")
    return "\n".join(html)


def _figure(svg: str, caption: str | None) -> str:
    cap = f"<figcaption>{_inline(caption)}</figcaption>" if caption else ""
    return f'<figure class="hw-figure">{svg}{cap}</figure>'


def _cell(value: object) -> str:
    if isinstance(value, float):
        from .svg import fmt

        return f'<td class="hw-num">{escape(fmt(value, 4))}</td>'
    if isinstance(value, int) and not isinstance(value, bool):
        return f'<td class="hw-num">{value}</td>'
    return f"<td>{escape(str(value))}</td>"


@dataclass
class Section:
    """One titled part of a report; each method appends a block and returns the section (for chaining)."""

    title: str
    intro: str | None = None
    anchor: str = ""
    blocks: list[str] = field(default_factory=list)

    def text(self, content: str, *, raw_html: bool = False) -> "Section":
        """Add prose: light Markdown (escaped; see :func:`markdown_light`), or trusted HTML with ``raw_html``."""
        self.blocks.append(f'<div class="hw-text">{content if raw_html else markdown_light(content)}</div>')
        return self

    def heading(self, title: str) -> "Section":
        """Add a sub-heading inside the section."""
        self.blocks.append(f"<h3>{escape(title)}</h3>")
        return self

    def figure(self, svg: str, caption: str | None = None) -> "Section":
        """Add one figure (an SVG string, e.g. from :mod:`headwise.report.svg`) with an optional caption."""
        self.blocks.append(_figure(svg, caption))
        return self

    def grid(self, figures: Iterable[str | tuple[str, str | None]]) -> "Section":
        """Add figures side by side, wrapping onto new lines; items are SVG strings or ``(svg, caption)``."""
        items = [_figure(f, None) if isinstance(f, str) else _figure(*f) for f in figures]
        if items:
            self.blocks.append('<div class="hw-grid">' + "".join(items) + "</div>")
        return self

    def table(self, rows: Sequence[Sequence[object]], header: Sequence[str] | None = None,
              caption: str | None = None) -> "Section":
        """Add a table; floats are right-aligned and shortened, everything else is escaped text."""
        parts = ['<table class="hw-table">']
        if caption:
            parts.append(f"<caption>{_inline(caption)}</caption>")
        if header:
            parts.append("<thead><tr>" + "".join(f"<th>{escape(str(h))}</th>" for h in header) + "</tr></thead>")
        parts.append("<tbody>")
        for row in rows:
            parts.append("<tr>" + "".join(_cell(v) for v in row) + "</tr>")
        parts.append("</tbody></table>")
        self.blocks.append("".join(parts))
        return self

    def render(self) -> str:
        """This section as an HTML ``<section>`` element."""
        intro = f'<div class="hw-intro">{markdown_light(self.intro)}</div>' if self.intro else ""
        return (f'<section class="hw-section" id="{escape(self.anchor)}"><h2>{escape(self.title)}</h2>'
                f"{intro}{''.join(self.blocks)}</section>")


class Report:
    """An HTML report: a header (title, subtitle, key facts), a table of contents and sections."""

    def __init__(self, title: str, subtitle: str | None = None, meta: dict[str, object] | None = None,
                 footer: str | None = None) -> None:
        self.title = title
        self.subtitle = subtitle
        self.meta: dict[str, object] = dict(meta or {})
        self.footer = footer
        self.sections: list[Section] = []

    def add_section(self, title: str, intro: str | None = None) -> Section:
        """Append a section (listed in the table of contents) and return it for filling."""
        base, anchor, n = slugify(title), slugify(title), 2
        taken = {s.anchor for s in self.sections}
        while anchor in taken:
            anchor, n = f"{base}-{n}", n + 1
        section = Section(title=title, intro=intro, anchor=anchor)
        self.sections.append(section)
        return section

    def render(self) -> str:
        """The whole page as one HTML string."""
        meta = "".join(f"<div><dt>{escape(str(k))}</dt><dd>{escape(str(v))}</dd></div>"
                       for k, v in self.meta.items())
        header = (f'<header class="hw-header"><h1>{escape(self.title)}</h1>'
                  + (f'<p class="hw-subtitle">{_inline(self.subtitle)}</p>' if self.subtitle else "")
                  + (f'<dl class="hw-meta">{meta}</dl>' if meta else "") + "</header>")
        toc = ""
        if len(self.sections) > 1:
            toc = ('<nav class="hw-toc"><h2>Contents</h2><ol>'
                   + "".join(f'<li><a href="#{escape(s.anchor)}">{escape(s.title)}</a></li>' for s in self.sections)
                   + "</ol></nav>")
        footer = f'<footer class="hw-footer">{_inline(self.footer)}</footer>' if self.footer else ""
        body = "".join(s.render() for s in self.sections)
        return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                '<meta name="viewport" content="width=device-width, initial-scale=1">'
                f"<title>{escape(self.title)}</title><style>{CSS}</style><script>{SCRIPT}</script></head>"
                f'<body><div class="hw-page">{header}{toc}<main>{body}</main>{footer}</div></body></html>\n')

    def write(self, out_dir: str | os.PathLike, overwrite: bool = False) -> Path:
        """Write ``out_dir/report.html`` atomically (creating ``out_dir`` if needed) and return its path.

        An existing ``report.html`` is replaced only with ``overwrite``; checking the whole directory is the
        caller's job (:func:`headwise.io.files.check_writable_dir`).
        """
        out = Path(out_dir)
        if out.exists() and not out.is_dir():
            raise HeadwiseError(f"{out} exists and is not a directory; choose another output path")
        out.mkdir(parents=True, exist_ok=True)
        path = out / REPORT_FILE
        if path.exists() and not overwrite:
            raise HeadwiseError(f"{path} already exists; pass --force (overwrite=True) to replace it")
        atomic_write_text(path, self.render())
        return path
