"""A report section and what it renders: ``Section`` (its settings, what it measures, how it renders), the
registry that finds it, and the ``Part`` (text, tables, figures, findings) it renders into Markdown with every
table's CSV beside it.

Tables are written with ``posenc_lab.tables`` (the CSV and the Markdown come from the same DataFrame), every
file atomically.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import pandas as pd

from posenc_lab.io import write_text
from posenc_lab.tables import markdown_table, write_csv

if TYPE_CHECKING:
    from ..verdicts import Evidence

# What a section is rendered for: once per language corpus, once per recall-probe group, once per report.
CORPUS, RECALL, REPORT = "corpus", "recall", "report"
SCOPES = (CORPUS, RECALL, REPORT)


class Context(Protocol):
    """What a section reads (report.py builds one per section and group): its settings block, the shared settings,
    its group (the runs of one corpus or recall group; None for a report-wide section), the report, where it writes
    and the log. Stated here, so that the sections know nothing of the report that runs them."""

    section: Section
    settings: Any
    shared: Any
    group: Any
    report: Any
    out: Path
    suffix: str
    log: Callable[[str], None]

    def measured(self, name: str | None = None) -> Any:
        """Section ``name``'s measurement of this group (default: this section's), computed once."""

    def file(self, name: str) -> Path:
        """Where this section writes ``name``, in its group's folder."""

    @property
    def title(self) -> str:
        """The section's title, with its corpus where the report holds several."""


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
class Part:
    """What a section renders, as: notes, text, the first table, the findings (bullet lines computed from the
    section's numbers), the other tables, the figures. ``title`` None: the section's own (with its corpus)."""

    text: str = ""
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # bullets before the tables (e.g. a smoke run)
    title: str | None = None
    numbered: bool = True


class Section:
    """One section of the report. A subclass sets ``name`` (its key in ``ablate.analysis.sections`` and, with
    ``Settings``, of its block ``ablate.analysis.<name>``), ``title`` and ``scope``, and overrides ``render``;
    ``measure`` computes its numbers once (other sections read them with ``ctx.measured(name)``), and
    ``evidence`` gives the measures of conf/paper.yaml it provides. ``@register`` makes the report find it."""

    name: ClassVar[str]
    title: ClassVar[str]
    scope: ClassVar[str] = CORPUS
    numbered: ClassVar[bool] = True
    Settings: ClassVar[type | None] = None  # a dataclass: the keys of ablate.analysis.<name>, checked by OmegaConf

    def measure(self, ctx: Context) -> Any:
        return None

    def evidence(self, ctx: Context, measured: Any) -> dict[str, Evidence]:
        return {}

    def render(self, ctx: Context, measured: Any) -> Part | None:
        raise NotImplementedError


SECTIONS: dict[str, type[Section]] = {}


def register(cls: type[Section]) -> type[Section]:
    """Class decorator: ``cls`` joins the registry under ``cls.name`` (a second class of that name is refused)."""
    for attr in ("name", "title"):
        if not isinstance(getattr(cls, attr, None), str) or not getattr(cls, attr):
            raise TypeError(f"section {cls.__qualname__}: set the class attribute {attr} (a non-empty string)")
    if cls.scope not in SCOPES:
        raise TypeError(f"section {cls.name}: scope must be one of {', '.join(SCOPES)}, got {cls.scope!r}")
    if cls.name in SECTIONS and SECTIONS[cls.name] is not cls:
        raise ValueError(f"a section named {cls.name!r} is already registered ({SECTIONS[cls.name].__qualname__})")
    SECTIONS[cls.name] = cls
    return cls


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


def render(parts: list[Part], out: Path, title: str, preamble: list[str]) -> Path:
    """Write ``out/report.md``: the title, the preamble paragraphs, then the parts in order, numbered 1..n
    (a part with ``numbered`` False keeps its title without a number)."""
    out = Path(out)
    lines = [f"# {title}\n", *[p.strip() + "\n" for p in preamble if p]]
    n = 0
    for s in parts:
        if s.numbered:
            n += 1
            lines.append(f"## {n}. {s.title}\n")
        else:
            lines.append(f"## {s.title}\n")
        if s.notes:
            lines.append(bullets(s.notes))
        if s.text:
            lines.append(s.text.strip() + "\n")
        for i, t in enumerate(s.tables):
            if md := render_table(t, out):
                lines.append(md)
            if i == 0 and s.findings:
                lines.append(bullets(s.findings))
        if not s.tables and s.findings:
            lines.append(bullets(s.findings))
        for f in s.figures:
            lines.append(render_figure(f, out))
    return write_text(out / "report.md", "\n".join(lines))
