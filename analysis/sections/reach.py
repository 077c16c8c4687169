"""The retrieval-reach section: recall accuracy by distance bin and cell with intervals (a heatmap), and each
cell's reach, the distance up to which it recalls above the chance its own predictions score against other items'
values (a permutation null), with its interval (``analysis/reach.py``). It reads the recall section's as-trained
evaluation (``ablate.analysis.recall``: the same dumps, computed once)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from posenc_lab.tables import write_csv

from .. import plots
from ..reach import Reach as ReachValue
from ..reach import above_null, answers, per_seed, reach_interval
from ..recall import chance
from .base import RECALL, Figure, Part, Section, Table, register


@dataclass
class ReachSettings:
    """``ablate.analysis.reach``: the distance bins' width (None: the segment length L) and the reach's bootstrap
    replicates."""

    bin_width: int | None
    n_boot: int

    def __post_init__(self):
        if self.bin_width is not None and self.bin_width < 1:
            raise ValueError(f"ablate.analysis.reach.bin_width must be >= 1 (or null: L), got {self.bin_width!r}")
        if self.n_boot < 20:
            raise ValueError(f"ablate.analysis.reach.n_boot must be >= 20 replicates, got {self.n_boot!r}")


@dataclass
class ReachMeasured:
    bins: pd.DataFrame  # one row per cell and distance bin
    reach: dict[str, ReachValue]
    seeds: dict[str, list[int]]  # each seed's own reach
    width: int
    marks: dict[str, int]  # reference distances: L, L + M, N_layer (L + M), the training range's end
    uniform: float  # 1 / n_values: the chance of uniform values, a reference beside each bin's estimated one


def _marks(runs) -> dict[str, int]:
    r = next((x for x in runs if x.mem_len), runs[0])
    L, M, layers = r.segment_len, r.mem_len, int(r.config["model"]["n_layer"])
    out = {"L": L}
    if M:
        out.update({"L + M": L + M, f"{layers} (L + M)": layers * (L + M)})
    trained = (r.config["data"].get("corpus") or {}).get("max_distance")
    if trained is not None:
        out["trained to"] = int(trained)
    return out


def table(m: ReachMeasured, cells: dict) -> pd.DataFrame:
    rows = []
    for cell, r in m.reach.items():
        b = m.bins[m.bins["cell"] == cell]
        above = b[b["above"]]
        span = m.marks.get("L + M") or m.marks["L"]  # the memory cells' L + M, for every cell alike
        rows.append(
            {
                "cell": cell,
                "seeds": len(cells[cell]),
                "answers": int(b["answers"].sum()),
                "reach": r.text(),
                "reach_per_seed": ", ".join(str(v) if v else "none" for v in m.seeds[cell]),
                "reach_over_L_plus_M": r.estimate / span,
                "farthest_above": int(above["largest"].max()) if len(above) else 0,
                "farthest_evaluated": r.farthest,
                "reach_estimate": r.estimate,
                "reach_low": r.low,
                "reach_high": r.high,
            }
        )
    return pd.DataFrame(rows)


@register
class Reach(Section):
    name = "reach"
    title = "Retrieval reach"
    scope = RECALL
    Settings = ReachSettings

    def measure(self, ctx) -> ReachMeasured:
        g, s, level = ctx.group, ctx.settings, ctx.shared.level
        trained = g.as_trained(ctx.report.settings.blocks["recall"], "recall", "recall as trained")
        width = s.bin_width or max(r.segment_len for r in g.runs)
        parts, reach, seeds = [], {}, {}
        for cell, runs in g.cells.items():
            a = answers(runs, trained)
            t = above_null(a, width, level)  # low, high: at the level; `above`: the joint one
            t.insert(0, "cell", cell)
            parts.append(t)
            reach[cell] = reach_interval(a, width, level, s.n_boot, table=t)
            seeds[cell] = per_seed(a, width, level)
        bins = pd.concat(parts, ignore_index=True)
        write_csv(bins, ctx.file("recall/reach_accuracy.csv"))
        return ReachMeasured(bins, reach, seeds, width, _marks(g.runs), chance(g.runs[0]))

    def render(self, ctx, m: ReachMeasured) -> Part:
        t = table(m, ctx.group.cells)
        figure = plots.reach_heatmap(m.bins, t, m.marks, ctx.file("recall/reach_heatmap.png"))
        level = f"{ctx.shared.level:.0%}"
        marks = ", ".join(f"{k} = {v}" for k, v in m.marks.items())
        text = (
            f"Settings: {ctx.group.settings_line}. Answer accuracy by the distance D of the planted value, in bins "
            f"(lo, hi] of {m.width}, each answer counted once with its seeds' hits averaged; intervals {level}: "
            f"Wilson's over the bin's answers, widened by the design effect of the probe's units (chunks of a few "
            f"items). Answers whose value was planted before the evaluated stream began are left out. **Chance** "
            f"is estimated, not assumed: a bin's chance is the accuracy its own predictions score against the "
            f"values of the bin's other items (the mean over re-pairings; 1 / n_values = {m.uniform:.4f} only "
            f"if values and predictions are uniform), and the **null** of a bin is that its predictions carry "
            f"nothing of their own item's value, tested by re-pairing the values at random (a permutation test, "
            f"exact past a cell's window whatever the model predicts). **Reach**: the largest distance up to which "
            f"every bin lies above that null at {level} jointly (Bonferroni over the cell's bins), so that a cell at "
            f"chance reads none and a window-only cell passes its window with probability at most "
            f"{1 - ctx.shared.level:.0%}: a lower bound at {level}. Its interval: from the lower end of a bootstrap "
            f"over seeds and units ({ctx.settings.n_boot} replicates, each against the same critical accuracies) to "
            f"the estimate, since no replicate may extend the reach through a bin the data do not show above the "
            f"null and no data bound it from above; `>=`: the farthest distance evaluated, so it may reach further. "
            f"`farthest_above`: the farthest bin above the null at all, at the same joint level. Reference "
            f"distances (dotted in the figure): {marks}; memory that moves back one segment per layer can reach "
            f"about N_layer (L + M) at most. Per bin: `recall/reach_accuracy.csv` (`chance`: the estimated chance; "
            f"`critical`: the accuracy to exceed; `p_value`: the permutation test's; `above`: above the null at the "
            f"joint level; `seed_sd`: the seeds' own spread)."
        )
        findings = []
        for name in ("L", "L + M", next((k for k in m.marks if k.endswith("(L + M)")), None)):
            if name in m.marks:
                past = t.loc[t["reach_estimate"] > m.marks[name], "cell"].tolist()
                findings.append(f"reach past {name} = {m.marks[name]}: {', '.join(past) or 'no cell'}")
        if none := t.loc[t["reach_estimate"] == 0, "cell"].tolist():
            findings.append(f"no reach (not above the null even in the nearest bin): {', '.join(none)}")
        return Part(
            text,
            [Table("table_reach", t, "retrieval reach per cell", {"reach_over_L_plus_M": 2})],
            [Figure(figure, "recall accuracy by distance bin and cell; white ticks: each cell's reach")],
            findings,
        )
