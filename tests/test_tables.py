"""One table writer: the same rows as CSV, Markdown and text, from a DataFrame or a list of dicts."""

from __future__ import annotations

import csv

import numpy as np
import pandas as pd

from posenc_lab.tables import cell, markdown_table, text_table, write_table


def test_cells():
    assert [cell(None), cell(float("nan")), cell(np.inf), cell(pd.NA)] == ["n/a"] * 4
    assert [cell(True), cell(np.bool_(False)), cell(np.int64(7)), cell(3)] == ["yes", "no", "7", "3"]
    assert [cell(12345.6), cell(12.345), cell(0.12345)] == ["12,346", "12.35", "0.123"]  # by magnitude
    assert cell(0.12345, decimals=4) == "0.1235" and cell(2.0, decimals=0) == "2"
    assert cell("a|b\nc") == "a\\|b c"  # Markdown-safe


def test_dataframe_and_dicts_give_the_same_tables(tmp_path):
    records = [{"scheme": "a", "bpb": 1.23456, "n": 3}, {"scheme": "b", "bpb": float("nan"), "n": 4}]
    df = pd.DataFrame(records)
    assert (
        markdown_table(df, decimals={"bpb": 2})
        == markdown_table(records, decimals={"bpb": 2})
        == ("| scheme | bpb | n |\n|---|---|---|\n| a | 1.23 | 3 |\n| b | n/a | 4 |")
    )
    assert text_table(records, columns=["n", "scheme"]).splitlines() == ["n  scheme", "3       a", "4       b"]
    for name, rows in (("df", df), ("dicts", records)):
        paths = write_table(rows, tmp_path / name, header="# head")
        with open(paths["csv"]) as f:
            back = list(csv.DictReader(f))
        assert [r["scheme"] for r in back] == ["a", "b"] and float(back[0]["bpb"]) == 1.23456  # full precision
        assert paths["md"].read_text().startswith("# head\n\n| scheme | bpb | n |")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["df.csv", "df.md", "dicts.csv", "dicts.md"]  # no temp files
    assert markdown_table([]) == "(no rows)"
