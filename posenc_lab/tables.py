"""One table writer for the benchmark and the report: the same rows as CSV, Markdown and plain text.

Rows are a pandas DataFrame or a list of dicts (columns: the DataFrame's, or the first row's keys).
A cell is written by ``cell``: missing or non-finite numbers are ``n/a``, booleans ``yes``/``no``,
integers as they are, floats with ``decimals`` places (per column, else ``default``) or, with no
decimals given, by magnitude (``1,234`` / ``12.34`` / ``0.123``). The CSV keeps full precision; files
are written atomically (``posenc_lab.io``).

    write_table(rows, out / "bench", header="2026-01-01  torch 2.x ...")   # bench.csv + bench.md
    markdown_table(df, decimals={"bpb": 3}, default=4)
"""

from __future__ import annotations

import csv
import math
import numbers
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .io import atomic_path, write_text

Rows = Any  # a pandas DataFrame or a sequence of mappings


def _records(rows: Rows, columns: Sequence[str] | None) -> tuple[list[str], list[Mapping[str, Any]]]:
    if hasattr(rows, "to_dict") and hasattr(rows, "columns"):  # a DataFrame, without importing pandas here
        cols = [str(c) for c in rows.columns]
        records = rows.to_dict("records")
    else:
        records = list(rows)
        cols = list(records[0].keys()) if records else []
    return (list(columns) if columns is not None else cols), records


def _missing(v: Any) -> bool:
    if v is None:
        return True
    try:
        return bool(v != v) or (isinstance(v, numbers.Real) and not math.isfinite(v))
    except TypeError:  # pandas' NA has no truth value
        return True
    except ValueError:  # an array: not a missing cell
        return False


def cell(v: Any, decimals: int | None = None) -> str:
    """One value as table text (see the module doc). Text loses ``|`` and newlines (Markdown-safe)."""
    if isinstance(v, str):
        return v.replace("|", "\\|").replace("\n", " ")
    if _missing(v):
        return "n/a"
    if isinstance(v, bool) or getattr(getattr(v, "dtype", None), "kind", "") == "b":
        return "yes" if v else "no"
    if isinstance(v, numbers.Integral):
        return str(int(v))
    if isinstance(v, numbers.Real):
        v = float(v)
        if decimals is not None:
            return f"{v:.{decimals}f}"
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}" if abs(v) >= 1 else f"{v:.3f}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def _cells(rows: Rows, columns, decimals, default) -> tuple[list[str], list[list[str]]]:
    cols, records = _records(rows, columns)
    decimals = decimals or {}
    return cols, [[cell(r.get(c), decimals.get(c, default)) for c in cols] for r in records]


def markdown_table(
    rows: Rows,
    columns: Sequence[str] | None = None,
    decimals: Mapping[str, int] | None = None,
    default: int | None = None,
) -> str:
    """A Markdown table with the same columns (and order) as the CSV; empty rows give ``(no rows)``."""
    cols, body = _cells(rows, columns, decimals, default)
    if not cols:
        return "(no rows)"
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body])


def text_table(
    rows: Rows,
    columns: Sequence[str] | None = None,
    decimals: Mapping[str, int] | None = None,
    default: int | None = None,
) -> str:
    """A plain-text table for the terminal, columns right-aligned."""
    cols, body = _cells(rows, columns, decimals, default)
    if not cols:
        return "(no rows)"
    widths = [max(len(c), *(len(r[i]) for r in body)) for i, c in enumerate(cols)]
    return "\n".join("  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in [cols, *body])


def text_row(row: Mapping[str, Any], columns: Sequence[str] | None = None) -> str:
    """One row as ``key=value`` pairs (progress lines)."""
    return "  ".join(f"{c}={cell(row[c])}" for c in (columns or list(row)))


def write_csv(rows: Rows, path: str | Path, columns: Sequence[str] | None = None) -> Path:
    """The rows as CSV at ``path``, atomically, full precision (a DataFrame through its own ``to_csv``)."""
    cols, records = _records(rows, columns)
    with atomic_path(path) as tmp:
        if hasattr(rows, "to_csv"):
            rows.to_csv(tmp, index=False, columns=cols or None)
        else:
            with open(tmp, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
                writer.writeheader()
                writer.writerows(records)
    return Path(path)


def write_table(
    rows: Rows,
    stem: str | Path,
    header: str = "",
    columns: Sequence[str] | None = None,
    decimals: Mapping[str, int] | None = None,
    default: int | None = None,
) -> dict[str, Path]:
    """``stem``.csv and ``stem``.md (``header``, a blank line, the Markdown table); returns both paths."""
    stem = Path(stem)
    csv_path = write_csv(rows, stem.with_name(stem.name + ".csv"), columns)
    md = markdown_table(rows, columns, decimals, default)
    md_path = write_text(stem.with_name(stem.name + ".md"), (header + "\n\n" if header else "") + md + "\n")
    return {"csv": csv_path, "md": md_path}
