"""The RECL section: RECL per cell and r with intervals, the gain curves with their bands (small multiples),
and with against without memory as a paired difference of the same bootstrap replicates."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import plots
from ..dumps import same_tokens, seed_losses
from ..recl import ReclResult, interval_text, memory_areas, recl, recl_text
from ..runs import Run, grid_segment
from ..stats import p_text
from .base import Figure, Part, Section, Table, register


def table(res: ReclResult, step: int) -> pd.DataFrame:
    """A row per cell: RECL per r with its interval, then the interpolated crossings. Read at the grid, so: a
    value at the first c the cell was tested at is '<=c' (already below the threshold there: the truth may be
    smaller), and an interval narrower than the grid step is marked '*' (the grid's resolution, not certainty)."""
    rows = []
    for cell, g in res.table.groupby("model", sort=False):
        c = res.curves[(res.curves["model"] == cell) & np.isfinite(res.curves["fitted"])]["c"]
        first = float(c.min()) if len(c) else float("nan")
        row = {"cell": cell}
        for r in res.r_values:
            h = g[g["r"] == r].iloc[0]
            at_first = not h["censored"] and h["recl"] == first
            row[f"recl_r{r:g}"] = f"<={int(first)}" if at_first else recl_text(h["recl"], bool(h["censored"]))
            if np.isfinite(h["recl_low"]):
                narrow = "*" if h["recl_high"] - h["recl_low"] < step else ""
                low, high = recl_text(h["recl_low"], False), recl_text(h["recl_high"], False)
                row[f"interval_r{r:g}"] = f"[{low}, {high}]{narrow}"
            else:
                row[f"interval_r{r:g}"] = "n/a"
        for r in res.r_values:
            row[f"seeds_r{r:g}"] = g[g["r"] == r].iloc[0]["seeds"]
        for r in res.r_values:  # descriptive: read between the grid points, judged by nothing
            h = g[g["r"] == r].iloc[0]
            row[f"crossing_r{r:g}"] = crossing_text(h, first)
        rows.append(row)
    return pd.DataFrame(rows)


def crossing_text(h, first: float = float("nan")) -> str:
    """'43.5 [38.1, 50.2]', '>128' (censored), '<=8' (below the threshold at the first c tested: no crossing
    to interpolate), 'n/a': the interpolated crossing of a table row."""
    if not np.isfinite(h["crossing"]):
        return "n/a"
    if h["crossing_censored"]:
        return f">{h['crossing']:.0f}"
    if h["crossing"] == first:
        return f"<={first:.0f}"
    band = f" [{h['crossing_low']:.1f}, {h['crossing_high']:.1f}]" if np.isfinite(h["crossing_low"]) else ""
    return f"{h['crossing']:.1f}{band}"


def memory_contrasts(res: ReclResult, cells: dict[str, list[Run]], level: float, step: int) -> list[str]:
    """RECL with minus without memory, per scheme that has both, from the same replicates; where an interval
    holds 0, what would separate them."""
    lines, holds_zero = [], False
    for c, o in _memory_pairs(cells):
        if c in res.names and o in res.names:
            parts = []
            for r in res.r_values:
                est, lo, hi = res.difference(c, o, r, level)
                holds_zero |= bool(np.isfinite(est) and lo <= 0 <= hi)
                parts.append(f"r = {r:g}: {interval_text(est, lo, hi, step)}")
            lines.append(f"RECL of {c} minus {o} (tokens, paired replicates): " + "; ".join(parts) + ".")
    if holds_zero:
        lines.append(
            f"Where such an interval holds 0, this grid (a step of {step} tokens) and this sample do not tell the two "
            "apart: they differ by less than a step, or not at all. A finer step (`ablate.analysis.context.step`) "
            "or more scored rows (`n_rows`) can separate them if they differ."
        )
    return lines


def _memory_pairs(cells: dict[str, list[Run]]) -> list[tuple[str, str]]:
    """(with memory, without) of each scheme and loss that has both; the scheme as the cell names it (``xl+ssmax`` is
    not ``xl``)."""
    return [
        (c, o)
        for c, g in cells.items()
        if g[0].recurrence
        for o, h in cells.items()
        if h[0].cell_name.scheme == g[0].cell_name.scheme and not h[0].recurrence and h[0].loss == g[0].loss
    ]


def _area_label(d) -> str:
    """What an area difference's interval leaves out: nothing, the seeds (a cell of one seed), or everything (not
    evaluated: a seed's area is not finite)."""
    if not np.isfinite(d.estimate):
        return " (not evaluated: a non-finite area)"
    return "" if d.covers_seeds else " (one seed a cell: the text only)"


def area_lines(res: ReclResult, step: int) -> list[str]:
    """The smooth estimand of memory (``recl.memory_areas``), one line per pair."""
    return [
        f"Area under the gain curve (the capped log-loss drop along the grid, r = 1, c up to {c_max}, nats; "
        "over seeds and text units, "
        f"`stats.paired_difference`) of {a} minus {b}: {d.text(4)}, one-sided p that memory gains more: "
        f"{p_text(d.p_value('>0'), d.df)}"
        + _area_label(d)
        + ". The area sums the gains over consecutive grid points: no threshold and no grid step in it, so it "
        "resolves a difference that RECL's crossing cannot."
        for a, b, c_max, d in res.areas
    ]


def seed_caveat(cells: dict[str, list[Run]]) -> str:
    """What the bootstrap's seed part can say with the seeds the cells have."""
    most = max((len(runs) for runs in cells.values()), default=0)
    if most <= 1:
        return "one seed a cell: the intervals cover the text only, not the training seed"
    return f"with at most {most} seeds a cell, the seed part is a bootstrap of {most} values: too narrow"


@register
class Recl(Section):
    name = "recl"
    title = "Relative effective context length (RECL)"

    @dataclass
    class Settings:
        """``ablate.analysis.recl`` (its bootstrap's replicates: ``ablate.analysis.context.n_boot``)."""

        threshold: float  # RECL: the first c whose fitted gain is below this (the paper's 1%)
        r_values: list[float]  # the fractions r of hardest tokens (the paper's Table 8: 0.1, 0.5, 1.0)

        def __post_init__(self):
            if not 0 < self.threshold < 1:
                raise ValueError(f"ablate.analysis.recl.threshold must be in (0, 1), e.g. 0.01, got {self.threshold!r}")
            if not self.r_values or not all(0 < r <= 1 for r in self.r_values):
                raise ValueError(f"ablate.analysis.recl.r_values must be fractions in (0, 1], got {self.r_values!r}")

    def measure(self, ctx) -> ReclResult:
        g, context = ctx.group, ctx.shared.context
        at_c = g.at_contexts
        ctx.log("  RECL (per seed; bootstrap over the text's units and seeds)")
        per_seed, units = seed_losses(g.cells, at_c, g.grid)
        delta = context.gain_delta(g.runs)
        s = ctx.settings
        res = recl(
            per_seed,
            g.grid,
            units,
            delta=delta,
            r_values=s.r_values,
            threshold=s.threshold,
            n_boot=context.n_boot,
            level=ctx.shared.level,
        )
        res.per_seed["seed"] = [g.cells[m][i].seed for m, i in zip(res.per_seed["model"], res.per_seed["seed"])]
        served = {c: [x for x in g.grid if x not in at_c[runs[0].name].not_served] for c, runs in g.cells.items()}
        res.areas = memory_areas(per_seed, g.grid, units, _memory_pairs(g.cells), served, ctx.shared.level)
        return res

    def render(self, ctx, res: ReclResult) -> Part:
        g, grid, level, n_boot = ctx.group, ctx.group.grid, ctx.shared.level, ctx.shared.context.n_boot
        pct = f"{ctx.settings.threshold:.0%}"
        step, delta = ctx.shared.context.fine_step(g.runs), ctx.shared.context.gain_delta(g.runs)
        L = grid_segment(g.runs)
        fine_top = next((a for a, b in zip(grid, grid[1:]) if b - a != step), grid[-1])
        documents = same_tokens(g.at_contexts)
        paper_recl = ctx.report.paper.get("recl") or ()
        text = (
            f"RECL (Transformer-XL appendix C) of this group, from per-token losses at attention lengths c = "
            f"{', '.join(map(str, grid))} (every {step} tokens up to {fine_top}, then doubling to "
            f"{grid[-1]}, past the training length L = {L}; the gain g(c, c + {delta})) on {len(documents):,} "
            "scored tokens of the test split "
            f"in {len(np.unique(documents))} units (families, or documents): runs with memory use memory c with the "
            "same-length mask, runs "
            f"without a sliding window of c tokens. Per seed: each run's gain curve against the other cells' first "
            f"seeds, so that a seed's RECL does not change when any cell gets another seed; a cell's RECL is the "
            f"mean of its seeds' (`seeds`: each one's; `recl_seeds.csv`). Two changes to the "
            f"paper's estimator, so that noise cannot fake a gain: the baseline of model m is the best of the *other* "
            f"models (leave-one-out: a model that gains nothing then gains nothing in expectation), and the gain "
            f"curve is fitted by a non-increasing function of c before the first c below {pct} is read. '>c': the "
            f"fitted gain stayed above {pct} up to the last c tested; '<={grid[0]}': it was below {pct} at the first c "
            f"tested (the truth may be smaller); '*': an interval narrower than the step of {step} tokens, which is "
            f"the grid's resolution, not certainty. `crossing`: RECL read between the grid points, "
            f"where the fitted curve crosses {pct} by linear interpolation (descriptive: no verdict reads it; it has "
            f"no grid step in it, the first-below value has). Brackets: {level:.0%} percentile intervals of a "
            f"cluster bootstrap over the units and each cell's seeds ({n_boot} replicates; {seed_caveat(g.cells)}). "
            f"Gain curves: `recl_curves.csv`. The group baseline caps each model by the others' best: a model much "
            f"worse than the rest is capped on every token, so its RECL says how far it gains on the tokens where it "
            f"beats them, not how far it uses context (it can read long while its own loss rises): read each model's "
            f"own-baseline effective context (the effective-context section) for that, and RECL for the paper's "
            f"comparison."
            + (" Paper (WikiText-103, Table 8, r = 0.1/0.5/1.0): " + ", ".join(paper_recl) + "." if paper_recl else "")
        )
        curves = res.curves[res.curves["r"].isin(res.r_values)]
        figure = plots.gain_curves(curves, ctx.file("recl_gain_curves.png"), ctx.settings.threshold)
        findings = memory_contrasts(res, g.cells, level, step) + area_lines(res, step)
        findings.append(
            "RECL values are point estimates of a threshold crossing; compare cells by the intervals and the paired "
            "differences above, not by the values alone."
        )
        return Part(
            text,
            [
                Table(
                    "table_recl",
                    table(res, step),
                    f"RECL in tokens per r (first c below {pct}, the mean over seeds), with {level:.0%} intervals over "
                    "units and seeds; crossing: interpolated, descriptive",
                ),
                Table("recl_seeds", res.per_seed, "RECL of every seed", show=False),
                Table("recl_curves", res.curves, "gain curves with bands", show=False),
            ],
            [
                Figure(
                    figure,
                    "RECL gain g(c, c + delta) by cell: the leave-one-out gain (dots), its monotone fit "
                    f"(line) and the bootstrap band; dashed: the {pct} threshold",
                )
            ],
            findings,
        )
