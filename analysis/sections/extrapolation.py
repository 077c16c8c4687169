"""The extrapolation section (descriptive): per cell, the change at the longest applicable length of each
window axis and past the training episodes, each with its interval (the same runs at two lengths: seeds
paired), the lengths a scheme cannot serve with its reason, and one figure per axis (a panel per cell)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import plots
from ..evidence import horizon_past
from ..extrapolation import NA_STATUS, ExtrapolationResult, ExtrapolationSettings, analyze
from ..runs import Run
from ..stats import NOT_EVALUATED, Difference, paired_difference
from .base import Figure, Part, Section, Table, register


def _contrast(
    res: ExtrapolationResult,
    group: list[Run],
    axis: str,
    la: int,
    lb: int | None,
    level: float,
    axis_b: str | None = None,
) -> Difference:
    """Loss at length la minus at lb over the same runs (lb None: against zero; ``axis_b``: lb on that axis, the
    same tokens), its interval at ``level``."""
    a = [res.tokens.get((r.name, axis, la)) for r in group]
    b = [res.tokens.get((r.name, axis_b or axis, lb)) for r in group] if lb is not None else None
    if any(x is None for x in a) or (b is not None and any(x is None for x in b)):
        return NOT_EVALUATED
    xa = np.stack([x[0] for x in a]).astype(np.float64)
    xb = np.stack([x[0] for x in b]).astype(np.float64) if b is not None else np.zeros_like(xa)
    return paired_difference(xa, xb, a[0][1], level, paired_seeds=True)


def summary(res: ExtrapolationResult, cells: dict[str, list[Run]], scale: float, level: float) -> pd.DataFrame:
    ok = res.table[res.table["status"] == "ok"]
    na = res.table[res.table["status"] == NA_STATUS]
    rows = []
    for cell, group in cells.items():
        names = [r.name for r in group]
        row = {"cell": cell, "seeds": len(group)}
        for axis in ("segment", "memory"):
            a = ok[(ok["axis"] == axis) & ok["run"].isin(names)]
            gone = na[(na["axis"] == axis) & na["run"].isin(names)]
            row[f"{axis}_na_from"] = int(gone["length"].min()) if len(gone) else None
            if a.empty:
                continue
            base = int(a[a["factor"] == 1.0]["length"].min())
            longest = int(a.groupby("run")["length"].max().min())
            row[f"{axis}_longest"] = longest
            row[f"{axis}_change"] = (
                _contrast(res, group, axis, longest, base, level).scaled(scale).text(3)
                if longest > base
                else "n/a (no longer length served)"
            )
        for axis in ("segment", "memory"):  # STRING on minus off, the same checkpoint and tokens, at the longest length
            on = ok[(ok["axis"] == f"{axis}+string") & ok["run"].isin(names)]
            if len(on) and f"{axis}_longest" in row:
                longest = row[f"{axis}_longest"]
                diff = _contrast(res, group, f"{axis}+string", longest, longest, level, axis_b=axis)
                row[f"string_{axis}_change"] = diff.scaled(scale).text(3)
        T = group[0].episode_len
        if T:
            row["past_episodes_change"] = _contrast(res, group, "horizon_past", T, None, level).scaled(scale).text(3)
        rows.append(row)
    df = pd.DataFrame(rows)
    for c in ("segment_na_from", "memory_na_from", "segment_longest", "memory_longest"):
        if c in df:
            df[c] = df[c].astype("Int64")
    return df


@register
class Extrapolation(Section):
    name = "extrapolation"
    title = "Extrapolation"
    Settings = ExtrapolationSettings

    def measure(self, ctx) -> ExtrapolationResult:
        few = [r for runs in ctx.group.few_cells.values() for r in runs]  # descriptive: fewer seeds
        return analyze(few, ctx.out / "extrapolation", ctx.settings, ctx.shared.split, log=ctx.log)

    def evidence(self, ctx, res: ExtrapolationResult) -> dict:
        hz = horizon_past(ctx.group.few_cells, res.tokens)
        return {} if hz is None else {"horizon_past": hz}

    def render(self, ctx, res: ExtrapolationResult) -> Part:
        s, group = ctx.settings, ctx.group
        cells, scale, fig, unit_name = group.few_cells, group.scale, group.figure, group.unit_name
        text = (
            f"Window axis: evaluation segment length L' = {', '.join(f'{f}L' for f in s.segment_factors)} without "
            f"memory, and attention length M' = {', '.join(f'{f}M' for f in s.memory_factors)} with memory and the "
            f"same-length mask (M = L for runs without memory). Horizon axis: every run as trained over streams of "
            f"{s.horizon_factor} x its training episode T, never reset; `past_episodes_change`: past T, the loss "
            f"minus that of the same tokens with resets every T as in training. `*_change`: the loss at the longest "
            f"applicable length minus at the training length, {unit_name}, {ctx.shared.level:.0%} intervals (over "
            "seeds and the text's units, families or documents, where a cell has 2+ seeds, else the text alone; the "
            f"same runs at two lengths, seeds paired; `seeds`: how many of the cell's runs were evaluated). Test "
            f"split, {s.n_rows} rows. "
            + (
                f"STRING (a training-free shift of far distances, An et al. 2025): every run whose scheme takes it "
                f"(`posenc.string_shift`) again with "
                f"distances from S = {s.string_shift_frac:g} of its training span on shifted back to W = "
                f"{s.string_window}; `string_*_change`: with minus without, the same checkpoint and tokens, at the "
                f"longest length. "
                if s.string_shift_frac is not None
                else ""
            )
            + "Descriptive. Every evaluation, "
            "with the reason where a scheme cannot serve a length: `extrapolation/extrapolation.csv`."
        )
        table = res.table.copy()
        table["value"] = table["loss_nats"] * scale
        ok, na = table[table["status"] == "ok"], table[table["status"] == NA_STATUS]
        marks = {
            r.name: (r.segment_len, r.mem_len or r.segment_len, r.episode_len or np.nan)
            for g in cells.values()
            for r in g
        }
        figures = []
        for axis, mark_index, xlabel in (
            ("segment", 0, "evaluation segment length L' (tokens)"),
            ("memory", 1, "attention length M' (tokens)"),
        ):
            part = ok[ok["axis"].isin([axis, f"{axis}+string"])]
            part = part.assign(cell=part["cell"] + np.where(part["axis"] == axis, "", " +STRING"))
            part = part.assign(mark=lambda d, k=mark_index: d["run"].map(lambda n: marks[n][k]))
            path = plots.small_multiples(
                part,
                x="length",
                y="value",
                path=ctx.file(f"extrapolation/extrapolation_{axis}.png"),
                mark="mark",
                title=f"Window axis: {xlabel.split(' (')[0]} (dotted: as trained)",
                xlabel=xlabel,
                ylabel=fig,
                na=na[na["axis"] == axis],
            )
            figures.append(Figure(path, f"extrapolation along the {axis} axis ({fig}; a panel per cell)"))
        hz = ok[ok["axis"] == "horizon"].assign(
            value=lambda d: d["delta_nats"] * scale, mark=lambda d: d["run"].map(lambda n: marks[n][2])
        )
        path = plots.small_multiples(
            hz,
            x="length",
            y="value",
            path=ctx.file("extrapolation/extrapolation_horizon.png"),
            mark="mark",
            logx=False,
            title="Horizon axis: loss minus the same tokens with resets every T (dotted: T)",
            xlabel="stream offset (tokens)",
            ylabel=f"change in {fig}",
        )
        figures.append(Figure(path, f"horizon axis: the change past the training episodes ({fig})"))
        na_rows = na[["cell", "axis", "length", "reason", "run"]].reset_index(drop=True)
        tables = [Table("table_extrapolation", summary(res, cells, scale, ctx.shared.level), "extrapolation by cell")]
        findings = []
        if len(na_rows):
            tables.append(Table("table_not_applicable", na_rows, "evaluations a scheme cannot serve, and why"))
            for (cell, axis), g in na_rows.groupby(["cell", "axis"], sort=False):
                findings.append(
                    f"Not applicable: {cell}, {axis} axis from length {g['length'].min()}: {g['reason'].iloc[0]}"
                )
        return Part(text, tables, figures, findings)
