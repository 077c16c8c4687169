"""The context-use section: what each model loses when the context beyond d is replaced by text of another unit
(``analysis/perturbation.py``: Sun et al. 2021; Khandelwal et al. 2018), as trained, for d from a few tokens to
4 (L + M) and d = 0 (the whole memory from another unit); the **context used**, the largest d whose use(d) is above
zero, per seed and per cell; and the same on the long-range tokens, the scored tokens only far context can
predict. It provides the measure ``context_use``: each token's use(L + M), seed by seed."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import plots
from ..perturbation import PerturbationSettings, Perturbed, long_range, perturbed, spec, use_table
from ..runs import RunError
from ..stats import mean_interval
from ..verdicts import Evidence
from .base import Figure, Part, Section, Table, register


def _use(x, scale: float) -> str:
    """use(d) with its interval; "0 (unchanged)" where no token's loss changed (nothing replaced was seen)."""
    if max(abs(x["low"]), abs(x["high"]), abs(x["use"])) == 0:
        return "0 (unchanged)"
    return f"{x['use'] * scale:+.4f} [{x['low'] * scale:+.4f}, {x['high'] * scale:+.4f}]"


def _d(value) -> str:
    """A distance of the grid as the tables print it ("none": no d, not even 0)."""
    return "none" if value is None or pd.isna(value) else f"{int(value)}"


MEASURE = "context_use"  # each token's use(L + M): the measure of memory_uses_context_past_span (conf/paper.yaml)


class ContextUseMeasured:
    """The dumps of a group, their use(d) per cell (all tokens and the long-range ones), and the tables."""

    def __init__(self, g, dumps: dict[str, Perturbed], s: PerturbationSettings, level: float, n_boot: int):
        first = dumps[g.runs[0].name]
        for name, d in dumps.items():
            if not np.array_equal(d.targets, first.targets) or not np.array_equal(d.scored, first.scored):
                raise RunError(f"the perturbed dump of {name} scores other tokens than its group's: evaluate alike")
        self.L, self.M = max(r.segment_len for r in g.runs), max(r.mem_len for r in g.runs)
        self.distances, self.block = first.distances, first.targets.shape[1]
        self.units = first.units[first.scored]
        corpus = g.runs[0].corpus()
        split = first.meta["split"]
        self.far = long_range(corpus.split(split), corpus.documents(split), first.targets, self.L + self.M, s.ngram)[
            first.scored
        ]
        self.ngram, self.level = s.ngram, level
        self.notes = {
            c: dumps[runs[0].name].offsets_note for c, runs in g.cells.items() if dumps[runs[0].name].offsets_note
        }
        self.uses = {c: np.stack([dumps[r.name].use() for r in runs]) for c, runs in g.cells.items()}
        self.true = {
            c: np.stack([dumps[r.name].true[dumps[r.name].scored] for r in runs]) for c, runs in g.cells.items()
        }
        seeds = {c: [r.seed for r in runs] for c, runs in g.cells.items()}
        self.curves, self.used = use_table(self.uses, self.distances, self.units, level, seeds, n_boot)
        self.far_units = len(np.unique(self.units[self.far]))
        if self.far_units >= 2:  # an interval needs two units
            far_uses = {c: x[..., self.far] for c, x in self.uses.items()}
            self.far_curves, self.far_used = use_table(
                far_uses, self.distances, self.units[self.far], level, seeds, n_boot
            )
        else:
            self.far_curves = self.far_used = None


@register
class ContextUse(Section):
    name = "context_use"
    title = "Context used: the loss when the far context is replaced"
    Settings = PerturbationSettings

    def measure(self, ctx) -> ContextUseMeasured | str:
        """The measurement, or why there is none (a split too small for rows of distinct units)."""
        g = ctx.group
        s = spec(ctx.settings, g.runs, ctx.shared.split)
        what = f"perturbed context, d = {s.distances[0]}..{s.distances[-1]}"
        try:
            dumps = g._dumps(perturbed, (s,), "perturbed", what)
        except RunError as e:
            return str(e)
        return ContextUseMeasured(g, dumps, ctx.settings, ctx.shared.level, ctx.shared.context.n_boot)

    def evidence(self, ctx, m: ContextUseMeasured | str) -> dict:
        if isinstance(m, str):
            return {}
        span = m.L + m.M
        if span not in m.distances:
            return {}
        k = m.distances.index(span)
        keys = {c: runs[0].cell_name for c, runs in ctx.group.cells.items()}
        return {MEASURE: Evidence({c: x[:, k] for c, x in m.uses.items()}, keys, m.units)}

    def render(self, ctx, m: ContextUseMeasured | str) -> Part:
        if isinstance(m, str):
            return Part(f"Not measured: {m}")
        g, level = ctx.group, ctx.shared.level
        L, span = m.L, m.L + m.M
        shown = [d for d in sorted({0, L, span, 2 * span, 4 * span}) if d in m.distances]
        text = (
            f"Settings: {g.settings_line}. What the far context is worth, shown rather than inferred (Sun et al. "
            f"2021; Khandelwal et al. 2018): each run as trained (its segments and memory, each row one episode "
            f"from an empty memory, no reset inside it) over "
            f"{ctx.settings.n_rows} rows of the {ctx.shared.split} split, scoring the last {m.block} inputs of each "
            f"({len(m.units):,} tokens, the same for every run), once with the true text and once for each d with "
            f"every input more than d before the scored block replaced by the same positions of a row of another "
            f"unit (for a model with memory, its memory is then built from that text). **use(d)**: the loss with the "
            f"context beyond d replaced minus the true loss, paired by token ({g.unit_name}; a scored token k inputs "
            f"into the block keeps d + k + 1 true inputs, so d is a lower bound on the distance replaced), with its "
            f"{level:.0%} interval over seeds and the text's units (`stats.mean_interval`). d = 0: everything before "
            f"the block replaced, the whole memory from another unit. **Context used**: the largest d of the grid "
            f"({', '.join(map(str, m.distances))}) whose use(d) interval lies above 0, for the cell (seeds and units) "
            f"and per seed (its text alone), the cell's with a {level:.0%} percentile interval of a cluster bootstrap "
            f"over units and seeds ({ctx.shared.context.n_boot} replicates); 'none': not even d = 0. No correction "
            f"over the grid's d: descriptive. "
            f"L = {L}, L + M = {span}: a model whose use(d) is above 0 past L + M uses context beyond one layer's "
            f"attention span, which is the paper's claim for recurrence."
        )
        table = self._table(m.curves, m.used, shown, g.scale)
        findings = [
            f"{row['cell']}: context used {_d(row['context_used'])} [{_d(row['used_low'])}, {_d(row['used_high'])}] "
            f"(per seed: {row['context_used_per_seed']})"
            for _, row in m.used.iterrows()
        ]
        n_far = int(m.far.sum())
        far_text = (
            f"Long-range tokens: the scored targets whose {m.ngram} preceding inputs and the target itself occur "
            f"earlier in the same document with the target {span} < distance <= {4 * span} back, and nowhere within "
            f"the last {span} (fixed by the text, L and M before any model): {n_far:,} of {len(m.units):,} scored "
            f"tokens ({n_far / max(len(m.units), 1):.1%}) in {m.far_units} units."
        )
        tables = [
            Table(
                "table_context_use",
                table,
                f"use(d) ({g.unit_name}, with {level:.0%} intervals) at d = {', '.join(map(str, shown))}, and the "
                "context used",
            ),
            Table("context_use_curves", self._tidy(m.curves, g.scale), "use(d) at every d, every seed", show=False),
        ]
        keys = {c: runs[0] for c, runs in g.cells.items()}
        frames = [m.curves.assign(tokens="all scored tokens")]
        if m.far_curves is not None:
            caption = (
                f"the long-range tokens: each cell's true loss ({g.unit_name}) on every scored token and on them, "
                f"use(L + M) on them with its {level:.0%} interval, and the context used on them"
            )
            tables.insert(1, Table("table_long_range", self._far_table(m, g.scale), caption))
            tables.append(
                Table("context_use_long_range", self._tidy(m.far_curves, g.scale), "use(d) on them", show=False)
            )
            frames.append(m.far_curves.assign(tokens=f"long-range tokens ({n_far:,})"))
        else:
            far_text += " Too few units for an interval: no table."
        curves = pd.concat(frames).assign(
            scheme=lambda d: d["cell"].map(lambda c: keys[c].scheme),
            memory=lambda d: d["cell"].map(lambda c: bool(keys[c].recurrence)),
            use=lambda d: d["use"] * g.scale,
            low=lambda d: d["low"] * g.scale,
            high=lambda d: d["high"] * g.scale,
        )
        figure = plots.context_use(
            curves, ctx.file("context_use.png"), {"L": L, "L + M": span}, f"use(d) ({g.figure})", level
        )
        notes = [f"{cell} {why}." for cell, why in m.notes.items()]
        return Part(
            text + "\n\n" + far_text,
            notes=notes,
            tables=tables,
            figures=[
                Figure(figure, f"use(d): the loss with the context beyond d replaced minus the true loss ({g.figure})")
            ],
            findings=findings,
        )

    @staticmethod
    def _tidy(curves: pd.DataFrame, scale: float) -> pd.DataFrame:
        cols = [c for c in curves.columns if c.startswith("use") or c in ("low", "high")]
        return curves.assign(**{c: curves[c] * scale for c in cols})

    @staticmethod
    def _table(curves: pd.DataFrame, used: pd.DataFrame, shown: list[int], scale: float) -> pd.DataFrame:
        at = curves.set_index(["cell", "d"])
        rows = []
        for _, u in used.iterrows():
            row = {
                "cell": u["cell"],
                "seeds": int(u["seeds"]),
                "context_used": _d(u["context_used"]),
                "interval": f"[{_d(u['used_low'])}, {_d(u['used_high'])}]",
                "context_used_per_seed": u["context_used_per_seed"],
            }
            for d in shown:
                x = at.loc[(u["cell"], d)]
                row[f"use_d{d}"] = _use(x, scale)
            rows.append(row)
        return pd.DataFrame(rows)

    @staticmethod
    def _far_table(m: ContextUseMeasured, scale: float) -> pd.DataFrame:
        """Per cell: its true loss on every scored token and on the long-range ones, use(L + M) on them, and their
        context used."""
        span, units = m.L + m.M, m.units
        at = m.far_curves.set_index(["cell", "d"])
        used = m.far_used.set_index("cell")
        rows = []
        for cell, true in m.true.items():
            every, far = mean_interval(true, units, m.level), mean_interval(true[:, m.far], units[m.far], m.level)
            row = {"cell": cell, "loss_all": every.estimate * scale, "loss_long_range": far.estimate * scale}
            if span in m.distances:
                x = at.loc[(cell, span)]
                row[f"use_d{span}_long_range"] = _use(x, scale)
            row["context_used_long_range"] = _d(used.loc[cell, "context_used"])
            rows.append(row)
        return pd.DataFrame(rows)
