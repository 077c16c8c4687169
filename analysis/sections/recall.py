"""The recall-probe section: accuracy by distance per cell (the verdict on memory is in the verdicts)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..stats import mean_interval
from . import Figure, Section, Table


def table(acc: pd.DataFrame, beyond: dict[str, np.ndarray], documents: np.ndarray | None) -> pd.DataFrame:
    """Per cell: accuracy within one segment and beyond it (with its interval over seeds and chunks)."""
    rows = []
    for cell, g in acc.groupby("cell", sort=False):
        L = int(g["segment_len"].iloc[0])
        within, past = g[g["bin_lo"] + 8 <= L], g[g["bin_lo"] >= L]

        def mean(p):
            return float(np.average(p["accuracy"], weights=p["answers"])) if len(p) else float("nan")

        row = {"cell": cell, "seeds": g["seed"].nunique(), "acc_within_L": mean(within), "acc_beyond_L": mean(past)}
        if documents is not None and cell in beyond:
            row["beyond_interval"] = mean_interval(beyond[cell], documents).text(3, signed=False)
        row["chance"] = float(g["chance"].iloc[0])
        row["answers"] = int(g["answers"].sum())
        rows.append(row)
    return pd.DataFrame(rows)


def section(acc: pd.DataFrame, t: pd.DataFrame, figure, settings_line: str, rows: int, tokens: int) -> Section:
    text = (
        f"Settings: {settings_line}. A value is planted and must be answered D tokens later; only answers are "
        f"scored. Accuracy by distance (bins of 8), each run evaluated as trained over {rows} streams x {tokens} "
        f"tokens of the test split; beyond one segment (D >= L) an answer can come only from the memory. "
        f"`beyond_interval`: 95%, seeds and chunks of a few items (independent draws) as units. Per bin: "
        f"`recall/recall_accuracy.csv`."
    )
    return Section(
        "Recall probe",
        text,
        [Table("table_recall", t, "answer accuracy within one segment and beyond it", {c: 4 for c in t.columns})],
        [Figure(figure, "recall accuracy by distance, a panel per cell")],
    )
