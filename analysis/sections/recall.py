"""The recall-probe section: accuracy by distance per cell, and the accuracy beyond one segment as the
``recall_beyond`` evidence of the verdicts (the verdict on memory is in the verdicts)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from posenc_lab.tables import write_csv

from .. import plots
from ..dumps import AsTrained
from ..evidence import recall_beyond
from ..recall import DISTANCE_BIN, accuracy_by_distance
from ..stats import mean_interval
from ..verdicts import Evidence
from .base import RECALL, Figure, Part, Section, Table, register


def table(acc: pd.DataFrame, beyond: dict[str, np.ndarray], documents: np.ndarray | None, level: float) -> pd.DataFrame:
    """Per cell: accuracy within one segment and beyond it (with its interval at ``level`` over seeds and chunks)."""
    rows = []
    for cell, g in acc.groupby("cell", sort=False):
        L = int(g["segment_len"].iloc[0])
        within, past = g[g["bin_lo"] + DISTANCE_BIN <= L], g[g["bin_lo"] >= L]

        def mean(p):
            return float(np.average(p["accuracy"], weights=p["answers"])) if len(p) else float("nan")

        row = {"cell": cell, "seeds": g["seed"].nunique(), "acc_within_L": mean(within), "acc_beyond_L": mean(past)}
        if documents is not None and cell in beyond:
            row["beyond_interval"] = mean_interval(beyond[cell], documents, level).text(3, signed=False)
        row["chance"] = float(g["chance"].iloc[0])
        row["answers"] = int(g["answers"].sum())
        rows.append(row)
    return pd.DataFrame(rows)


@dataclass
class RecallMeasured:
    accuracy: pd.DataFrame  # one row per run and distance bin
    beyond: Evidence | None  # 0/1 hits beyond one segment (None: the cells' segment lengths differ)


@register
class Recall(Section):
    name = "recall"
    title = "Recall probe"
    scope = RECALL
    Settings = AsTrained  # the recall runs evaluated as trained

    def measure(self, ctx) -> RecallMeasured:
        g = ctx.group
        trained = g.as_trained(ctx.settings, "recall", "recall as trained")
        acc = pd.concat([accuracy_by_distance(r, trained[r.name]) for r in g.runs], ignore_index=True)
        write_csv(acc, ctx.out / "recall" / "recall_accuracy.csv")
        return RecallMeasured(acc, recall_beyond(g.cells, trained))

    def evidence(self, ctx, m: RecallMeasured) -> dict:
        return {"recall_beyond": m.beyond} if m.beyond else {}

    def render(self, ctx, m: RecallMeasured) -> Part:
        ev = m.beyond
        t = table(m.accuracy, ev.cells if ev else {}, ev.documents if ev else None, ctx.shared.level)
        figure = plots.recall_accuracy(m.accuracy, ctx.out / "recall" / "recall_accuracy.png")
        text = (
            f"Settings: {ctx.group.settings_line}. A value is planted and must be answered D tokens later; only "
            f"answers are scored. Accuracy by distance (bins of {DISTANCE_BIN}), each run evaluated as trained over "
            f"{ctx.settings.n_streams} streams x {ctx.settings.n_tokens} tokens of the test split; beyond one segment "
            f"(D >= L) an answer can come only from the memory. `beyond_interval`: {ctx.shared.level:.0%}, seeds and "
            f"chunks of a few items (independent draws) as units. Per bin: `recall/recall_accuracy.csv`."
        )
        return Part(
            text,
            [Table("table_recall", t, "answer accuracy within one segment and beyond it", {c: 4 for c in t.columns})],
            [Figure(figure, "recall accuracy by distance, a panel per cell")],
        )
