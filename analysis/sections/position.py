"""Loss by position in the segment: context fragmentation, the motivation of segment-level recurrence.

Without memory the first tokens of a segment are predicted from almost no context, the last from L - 1 tokens;
memory gives the first ones the previous segment. From the as-trained dumps (``ctx.group.trained``): each target's
position in its segment is the one rule that cut the stream (``posenc_lab.data.streams.segment_schedule``, with
the run's L and episodes, as ``dumps.as_trained`` ran it). Only full segments that do not start an episode count:
there a memory cell has its memory (at an episode's start it has none, like a cell without), and every position
0..L-1 occurs equally often.

Per cell: the mean loss at each position with its interval (``stats.mean_interval``: seeds and the text's units),
and the *gap*: the mean loss over the first ``share`` x L positions minus over the last ``share`` x L (``share``:
conf/paper.yaml ``position_gap``, fixed with its verdict). The gap is a difference of two means over the same
units; ``gap_values`` writes it as a mean of per-token values (each token's influence on it: the linearization
of a ratio of means under cluster sampling) so that ``stats.paired_difference`` carries it over seeds and units
like any loss, and the verdicts judge it as the measure ``position_gap``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from posenc_lab.cellnames import CellName
from posenc_lab.data.streams import segment_schedule
from posenc_lab.errors import ConfigError

from ..dumps import TokenLosses, stack
from ..plots import _save, palette
from ..runs import Run
from ..stats import Difference, mean_interval, paired_difference
from ..verdicts import Evidence
from .base import Figure, Part, Section, Table, register

MEASURE = "position_gap"  # the measure conf/paper.yaml's verdicts name, and its block there


def gap_share(paper: dict) -> float:
    """``position_gap.share`` of conf/paper.yaml: the first and last share of a segment's positions the gap
    compares; ConfigError in one line if it is missing or not in (0, 0.5]."""
    block = paper.get(MEASURE)
    share = block.get("share") if isinstance(block, dict) else None
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 0.5:
        raise ConfigError(
            f"conf/paper.yaml: {MEASURE}.share must be a number in (0, 0.5] (the first and last share of a "
            f"segment's positions), got {share!r}; e.g. 0.25"
        )
    return float(share)


def segment_positions(n: int, segment_len: int, episode_len: int | None) -> tuple[np.ndarray, np.ndarray]:
    """([n] each target's position in its segment, [n] whether it counts: its segment is L long and does not
    start an episode) for a stream of ``n`` targets cut as the as-trained evaluation cuts it."""
    position, counted = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
    for start, length, _, reset in segment_schedule(n, segment_len, episode_len):
        position[start : start + length] = np.arange(length)
        counted[start : start + length] = length == segment_len and not reset
    return position, counted


def quarter(segment_len: int, share: float) -> int:
    """q: how many positions at each end of a segment the gap compares (positions < q against >= L - q)."""
    return max(1, int(share * segment_len + 1e-9))  # 1e-9: 0.29 x 100 is 28.999... in floating point


@dataclass
class CellPositions:
    """One cell's as-trained losses with their positions: loss [seeds, tokens] (every scored token), position,
    counted [tokens], units [tokens] (the text's units), L its segment length, key its cell name."""

    loss: np.ndarray
    position: np.ndarray
    counted: np.ndarray
    units: np.ndarray
    segment_len: int
    key: CellName


def cell_positions(runs: list[Run], dumps: dict[str, TokenLosses]) -> CellPositions:
    """A cell's ``CellPositions`` from its runs' as-trained dumps (every run of a cell has one L and episodes)."""
    r, d = runs[0], dumps[runs[0].name]
    position, counted = segment_positions(d.scored.shape[1], r.segment_len, r.episode_len)
    rows = d.scored.shape[0]
    return CellPositions(
        stack([dumps[x.name] for x in runs]),
        np.broadcast_to(position, (rows, len(position)))[d.scored],
        np.broadcast_to(counted, (rows, len(counted)))[d.scored],
        d.token_units,
        r.segment_len,
        r.cell_name,
    )


def _ends(c: CellPositions, share: float) -> tuple[np.ndarray, np.ndarray]:
    q = quarter(c.segment_len, share)
    return c.counted & (c.position < q), c.counted & (c.position >= c.segment_len - q)


def unmeasurable(c: CellPositions, share: float) -> str:
    """Why a cell's gap cannot be measured ("" if it can): its segments have no two ends, or none counts."""
    first, last = _ends(c, share)
    if c.segment_len < 2:
        return f"segments of L = {c.segment_len} token have no first and last positions apart"
    if not (first.any() and last.any()):
        return "no full segment that does not start an episode was scored (episodes of one segment, or a short text)"
    return ""


def gap_values(c: CellPositions, share: float) -> tuple[np.ndarray, np.ndarray]:
    """(values [seeds, k], selected [tokens]): on the k tokens of the first and last ``share`` of the positions,
    values whose mean over the tokens is, seed by seed, the gap theta_s = mean(first) - mean(last), and whose sum
    over a unit is N times the unit's share of the gap's linearization plus n_g theta_s:
    v = theta_s + N / n_first (loss - mean_first_s) on a first token, theta_s - N / n_last (loss - mean_last_s)
    on a last one. So a unit's residual in ``stats`` is its own contribution to the gap's error."""
    if why := unmeasurable(c, share):
        raise ValueError(f"{c.key}: {why}")
    first, last = _ends(c, share)
    selected = first | last
    n, x = int(selected.sum()), c.loss[:, selected]
    f, la = first[selected], last[selected]
    mean_f, mean_l = x[:, f].mean(1, keepdims=True), x[:, la].mean(1, keepdims=True)
    v = np.broadcast_to(mean_f - mean_l, x.shape).copy()
    v[:, f] += n / f.sum() * (x[:, f] - mean_f)
    v[:, la] -= n / la.sum() * (x[:, la] - mean_l)
    return v, selected


def no_memory_twin(key: CellName, keys: list[CellName]) -> CellName | None:
    """The cell equal to ``key`` but without memory (None for a cell without memory, or none trained)."""
    twin = replace(key, mem_len=0)
    return twin if key.memory and twin in keys else None


def by_position(c: CellPositions, level: float, scale: float) -> pd.DataFrame:
    """One row per position 0..L-1: the cell's mean loss there (in the figure's units) with its interval."""
    rows = []
    for p in range(c.segment_len):
        at = c.counted & (c.position == p)
        m = mean_interval(c.loss[:, at], c.units[at], level).scaled(scale)
        rows.append({"position": p, "tokens": int(at.sum()), "mean": m.estimate, "low": m.low, "high": m.high})
    return pd.DataFrame(rows)


@dataclass
class PositionMeasured:
    table: pd.DataFrame  # every cell at every position (the figure's units)
    summary: pd.DataFrame  # per cell: binned positions, the gap and memory's change of it
    evidence: Evidence  # the gap's per-token values of every cell, for the verdicts
    gaps: dict[str, Difference]  # cell -> its gap (nats, at ``level``)
    changes: dict[str, tuple[str, Difference]]  # memory cell -> (its no-memory twin, its gap minus the twin's; nats)
    share: float
    ends: dict[str, tuple[int, int]]  # cell -> (q, L): q positions at each end of its segments of L
    skipped: dict[str, str]  # cell -> why it has no positions to show


def _evidence(cells: dict[str, CellPositions], share: float) -> tuple[Evidence, dict[str, np.ndarray]]:
    """The gap's values of every cell on one set of tokens (the ends most cells share; the first cell's on a tie);
    a cell whose ends are other tokens (another L or other episodes) is named, unavailable."""
    found = {name: gap_values(c, share) for name, c in cells.items() if not unmeasurable(c, share)}
    ends = [selected.tobytes() for _, selected in found.values()]
    reference = max(ends, key=ends.count) if ends else None
    values, units = {}, np.zeros(0, dtype=np.int64)
    unavailable = {name: why for name, c in cells.items() if (why := unmeasurable(c, share))}
    for name, (v, selected) in found.items():
        if selected.tobytes() != reference:
            unavailable[name] = "another segment length or other episodes than the group's other cells: other tokens"
            continue
        values[name], units = v, cells[name].units[selected]
    return Evidence(values, {n: c.key for n, c in cells.items()}, units, unavailable), values


def measure_positions(
    cells: dict[str, CellPositions], share: float, level: float, scale: float, bins: int
) -> PositionMeasured:
    """The section's numbers (module docstring) from every cell's ``CellPositions``."""
    tables, summary, gaps, changes, ends = [], [], {}, {}, {}
    evidence, values = _evidence(cells, share)
    keys = {c.key: name for name, c in cells.items()}
    skipped = {name: why for name, c in cells.items() if (why := unmeasurable(c, share))}
    one_length = len({c.segment_len for c in cells.values()}) == 1  # the bins can be named by their positions
    for name, c in cells.items():
        if name in skipped:
            continue
        t = by_position(c, level, scale)
        tables.append(t.assign(cell=name, seeds=c.loss.shape[0], segment_len=c.segment_len))
        if name in values:
            v, units = values[name], evidence.documents
        else:  # not on the group's tokens: its own gap still, on its own ends
            v, selected = gap_values(c, share)
            units = c.units[selected]
        gaps[name] = mean_interval(v, units, level)
        q = quarter(c.segment_len, share)
        ends[name] = (q, c.segment_len)
        row = {"cell": name, "seeds": c.loss.shape[0]}
        for k, part in enumerate(np.array_split(np.arange(c.segment_len), bins)):
            at = c.counted & np.isin(c.position, part)
            label = f"pos {part[0]}-{part[-1]}" if one_length else f"part {k + 1} of {bins}"
            row[label] = float(c.loss[:, at].mean()) * scale
        row["gap_first_last"] = gaps[name].scaled(scale).text(4)
        twin = no_memory_twin(c.key, list(keys))
        if twin is not None and name in values and keys[twin] in values:
            changes[name] = (keys[twin], paired_difference(v, values[keys[twin]], evidence.documents, level))
        row["memory_change"] = changes[name][1].scaled(scale).text(4) if name in changes else "n/a"
        summary.append(row)
    columns = ["cell", "seeds", "segment_len", "position", "tokens", "mean", "low", "high"]
    table = pd.concat(tables, ignore_index=True)[columns] if tables else pd.DataFrame(columns=columns)
    return PositionMeasured(table, pd.DataFrame(summary), evidence, gaps, changes, share, ends, skipped)


LINES = "a colour per scheme; dashed: without memory, dotted: a recent-loss fraction"


def figure(table: pd.DataFrame, keys: dict[str, CellName], path, ylabel: str) -> None:
    """Loss against position, one line per cell with its interval as a band (``LINES``)."""
    colours = palette(list(dict.fromkeys(k.scheme for k in keys.values())))
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, d in table.groupby("cell", sort=False):
        k = keys[name]
        ax.plot(
            d["position"],
            d["mean"],
            color=colours[k.scheme],
            ls=":" if k.loss != "full" else "-" if k.memory else "--",
            label=name,
        )
        ax.fill_between(d["position"], d["low"], d["high"], color=colours[k.scheme], alpha=0.15, lw=0)
    ax.set(xlabel="position in the segment", ylabel=ylabel, title="Loss by position in the segment, as trained")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _save(fig, path)


@register
class Position(Section):
    name = "position"
    title = "Loss by position in the segment"

    @dataclass
    class Settings:
        bins: int  # the report's summary: equal bins of the positions 0..L-1 (the CSV has every position)

        def __post_init__(self):
            if isinstance(self.bins, bool) or self.bins < 1:
                raise ValueError(f"ablate.analysis.position.bins must be an integer >= 1, got {self.bins!r}")

    def measure(self, ctx) -> PositionMeasured:
        g = ctx.group
        share = gap_share(ctx.report.paper)
        cells = {c: cell_positions(runs, g.trained) for c, runs in g.cells.items()}
        bins = min(ctx.settings.bins, min(c.segment_len for c in cells.values()))
        return measure_positions(cells, share, ctx.shared.level, g.scale, bins)

    def evidence(self, ctx, m: PositionMeasured) -> dict:
        return {MEASURE: m.evidence}

    def render(self, ctx, m: PositionMeasured) -> Part:
        g, fig = ctx.group, ctx.group.figure
        qs = ", ".join(sorted({f"{q} of {L}" for q, L in m.ends.values()}))
        text = (
            f"Settings: {g.settings_line}. Each run as trained (the tokens of the ablation table), each target at its "
            "position in its segment; only full segments that do not start an episode (there a memory cell has its "
            f"memory). `pos a-b`: the mean {fig} over those positions (seed means). `gap_first_last`: the mean over "
            f"the first q positions minus over the last q (q = {m.share:g} L: {qs or 'no'} positions; conf/paper.yaml "
            f"`{MEASURE}`), with its {ctx.shared.level:.0%} interval over seeds and the text's units "
            "(families or documents; `stats.mean_interval`; the text alone for a cell of one seed); `memory_change`: a "
            "memory cell's gap minus its twin's without memory (negative: memory narrows it), the same units "
            f"(`stats.paired_difference`). Every position with its interval: `table_position{ctx.suffix}.csv`. The "
            "verdict on the gap is in the verdicts."
        )
        findings = [
            f"{name}: gap {m.gaps[name].scaled(g.scale).text(4)}; without memory ({twin}) "
            f"{m.gaps[twin].scaled(g.scale).text(4)}; memory changes it by {change.scaled(g.scale).text(4)} "
            f"({fig}, descriptive {ctx.shared.level:.0%} intervals)."
            for name, (twin, change) in m.changes.items()
        ] + [f"Not measured: {name}: {why}." for name, why in m.skipped.items()]
        if m.table.empty:  # no cell has a segment to read: the reasons, and nothing drawn
            return Part(text, findings=findings)
        path = ctx.file("position/loss_by_position.png")
        figure(m.table, {c: g.cells[c][0].cell_name for c in g.cells}, path, fig)
        return Part(
            text,
            [
                Table("table_position_summary", m.summary, f"loss by position in the segment ({fig})", {}),
                Table("table_position", m.table.rename(columns={"mean": fig}), f"{fig} at every position", show=False),
            ],
            [Figure(path, f"{fig} by position in the segment, a line per cell with its interval ({LINES})")],
            findings,
        )
