"""The report's text: a ``Section`` (title, text, tables, figures, findings) per analysis, one module of this
package per section, and the assembly of sections into one Markdown file with every table's CSV beside it.

The analyses measure (``dumps``, ``recl``, ``extrapolation``, ...); the modules here turn their numbers into
words and tables; ``report.py`` runs the analyses and orders the sections. Tables are written with
``posenc_lab.tables`` (the CSV and the Markdown come from the same DataFrame), every file atomically.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from posenc_lab.io import write_text
from posenc_lab.tables import markdown_table, write_csv


@dataclass
class Table:
    name: str  # the CSV's stem: <out>/<name>.csv
    df: pd.DataFrame
    caption: str
    decimals: dict[str, int] | None = None
    show: bool = True  # False: only the CSV, named in the section's text


@dataclass
class Figure:
    path: Path
    caption: str


@dataclass
class Section:
    """One part of the report, rendered as: notes, text, the first table, the findings (bullet lines
    computed from the section's numbers), the other tables, the figures. A title starting with "!"
    is not numbered."""

    title: str
    text: str = ""
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # bullets before the tables (e.g. a smoke run)


def render_table(t: Table, out: Path) -> str:
    path = write_csv(t.df, out / f"{t.name}.csv")
    if not t.show:
        return ""
    md = markdown_table(t.df, decimals=t.decimals, default=4)
    return f"**Table: {t.caption}** ([{path.name}]({path.name}))\n\n{md}\n"


def render_figure(f: Figure, out: Path) -> str:
    path = Path(f.path)
    rel = path.relative_to(out) if path.is_relative_to(out) else path
    return f"![{f.caption}]({rel.as_posix()})\n\n*Figure: {f.caption}*\n"


def bullets(items: list[str]) -> str:
    return "\n".join(f"- {i}" for i in items) + "\n" if items else ""


def render(sections: list[Section], out: Path, title: str, preamble: list[str]) -> Path:
    """Write ``out/report.md``: the title, the preamble paragraphs, then the sections numbered 1..n
    (a section titled "Files" or similar without a number is rendered last as given)."""
    out = Path(out)
    parts = [f"# {title}\n", *[p.strip() + "\n" for p in preamble if p]]
    n = 0
    for s in sections:
        if s.title.startswith("!"):  # unnumbered
            parts.append(f"## {s.title[1:]}\n")
        else:
            n += 1
            parts.append(f"## {n}. {s.title}\n")
        if s.notes:
            parts.append(bullets(s.notes))
        if s.text:
            parts.append(s.text.strip() + "\n")
        for i, t in enumerate(s.tables):
            if md := render_table(t, out):
                parts.append(md)
            if i == 0 and s.findings:
                parts.append(bullets(s.findings))
        if not s.tables and s.findings:
            parts.append(bullets(s.findings))
        for f in s.figures:
            parts.append(render_figure(f, out))
    return write_text(out / "report.md", "\n".join(parts))
