"""The effective-context section: each model against its own best (Khandelwal et al. 2018; Sun et al. 2021), from
the controlled-context dumps. Per cell: the loss at every context c minus the model's own best (a table at a few
c, every c in ``context_curves.csv``, and a figure), the effective context length (the smallest c within
``ablate.analysis.context.fraction`` of the own best) per seed and per cell with its interval, and where a
scheme stops serving c, with its reason. It provides the measure ``context_gain`` of conf/paper.yaml: each
token's loss at c = 2 (L + M) minus at c = L + M, seed by seed, each cell's own curve (what the context past the
memory model's training attention length changes; no other cell enters)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import distances, plots
from ..dumps import seed_losses
from ..effective_context import EffectiveContext, analyze, gain_tokens
from ..power import POWER
from ..recl import interval_text
from ..runs import grid_segment
from ..verdicts import INCONCLUSIVE, Evidence, Verdict
from .base import Figure, Part, Section, Table, register
from .recl import _memory_pairs

MEASURE = "context_gain"  # the measure of conf/paper.yaml this section provides


def lengths(g) -> tuple[int, int, int]:
    """(L, M, c_far = 2 (L + M)): the segment, the longest memory of the group, and the far end of the verdict."""
    L, M = grid_segment(g.runs), max(r.mem_len for r in g.runs)
    return L, M, 2 * (L + M)


def limit(g, runs) -> str:
    """Where a cell stops serving c, and why (the scheme's or the settings' reason), or that it serves the grid."""
    missing = {c: why for c, why in g.at_contexts[runs[0].name].not_served.items() if c in g.grid}
    if not missing:
        return f"every c to {g.grid[-1]}"
    first = min(missing)
    return f"not from c = {first}: {missing[first]}"


def context_gain(g) -> Evidence:
    """Per cell and seed, each token's loss at c = 2 (L + M) minus at c = L + M (negative: the context past the
    memory model's training attention length helps); a cell that cannot serve both is named with its reason."""
    L, M, far = lengths(g)
    near = L + M
    per_seed, units = seed_losses(g.cells, g.at_contexts, g.grid)
    out, unavailable = {}, {}
    for cell, runs in g.cells.items():
        not_served = g.at_contexts[runs[0].name].not_served
        try:
            if (why := not_served.get(far, not_served.get(near))) is not None:
                raise ValueError(f"cannot serve c = {far if far in not_served else near}: {why}")
            out[cell] = gain_tokens(per_seed[cell], g.grid, near, far)
        except ValueError as e:
            unavailable[cell] = str(e)
    return Evidence(out, {c: runs[0].cell_name for c, runs in g.cells.items()}, units, unavailable)


def reach_lines(judged: list[Verdict], scale: float, unit_name: str, power_of: dict[str, float]) -> list[str]:
    """For each inconclusive verdict on this section's measure: its measured difference beside the effect its
    design detects with 80% power at the level Holm judged it at (``power_of``: ``sections.verdicts.detectable``, from
    ``power.verdict_detectable``), so a reader sees whether the difference is smaller than the interval reaches."""
    lines = []
    for v in judged:
        tested = [c for c in v.comparisons if not c.note]
        power = power_of.get(v.id, float("nan"))
        if v.measure != MEASURE or v.status != INCONCLUSIVE or not tested or power != power:
            continue
        shown = "; ".join(f"{c.text} {c.difference.scaled(scale).text(3)}" for c in tested)
        largest = max(abs(c.difference.estimate) for c in tested)
        below = largest < power
        lines.append(
            f"`{v.id}` is inconclusive: {shown} ({unit_name}, at its Holm level {v.level:.1%}), where this design "
            f"detects {power * scale:.3g} with {POWER:.0%} power at that level (`power.verdict_detectable`, from "
            f"its seeds and units): the measured difference is "
            + (
                f"{largest / power:.0%} of that, smaller than the interval can reach; answering it needs a design "
                "that detects less (more seeds, more scored tokens, a longer segment where the difference may be "
                "larger, or fewer verdicts in Holm's family: e.g. `experiment=context`)."
                if below
                else f"{largest / power:.0%} of that, within reach: the interval still holds 0 (chance, at 80% power)."
            )
        )
    return lines


def table(res: EffectiveContext, g, shown: list[int], scale: float) -> pd.DataFrame:
    """A row per cell: how it was evaluated, its effective context with its interval and per seed, its best c,
    the gap to its own best at the ``shown`` contexts, and where it stops serving c."""
    cells, curves = res.cells.set_index("cell"), res.curves.set_index(["cell", "c"])
    rows = []
    for cell, runs in g.cells.items():
        h = cells.loc[cell]
        row = {
            "cell": cell,
            "context": "memory c" if runs[0].recurrence else "window of c",
            "seeds": len(runs),
            "c_eff": ("~" if h["censored"] else "") + f"{h['c_eff']:g}",
            "interval": f"[{h['low']:g}, {h['high']:g}]" if np.isfinite(h["low"]) else "n/a",
            "c_eff_per_seed": h["seeds"],
            "best_c_per_seed": h["best_c"],
        }
        for c in shown:
            if (cell, c) in curves.index:
                x = curves.loc[(cell, c)]
                row[f"gap_c{c}"] = f"{x['gap'] * scale:+.4f} [{x['low'] * scale:+.4f}, {x['high'] * scale:+.4f}]"
            else:
                row[f"gap_c{c}"] = "not served"
        row["served"] = limit(g, runs)
        rows.append(row)
    return pd.DataFrame(rows)


def _training_setting(run) -> tuple[int, int, int | None, int | None]:
    """(L, M, T, the same-length window or None) a run trained with."""
    model = run.config["model"]
    window = None
    if model.get("same_length"):
        window = run.mem_len + (model.get("same_length_keys", "mem_len+1") == "mem_len+1")
    return run.segment_len, run.mem_len, run.episode_len, window


@register
class EffectiveContextSection(Section):
    name = "effective_context"
    title = "Effective context against each model's own best"

    def measure(self, ctx) -> EffectiveContext:
        g, s = ctx.group, ctx.shared.context
        ctx.log("  effective context (own-baseline truncation curves)")
        per_seed, units = seed_losses(g.cells, g.at_contexts, g.grid)
        res = analyze(
            per_seed,
            g.grid,
            units,
            fraction=s.fraction,
            n_boot=s.n_boot,
            level=ctx.shared.level,
        )
        res.seeds["seed"] = [g.cells[m][i].seed for m, i in zip(res.seeds["cell"], res.seeds["seed"])]
        return res

    def evidence(self, ctx, res: EffectiveContext) -> dict:
        return {MEASURE: context_gain(ctx.group)}

    def render(self, ctx, res: EffectiveContext) -> Part:
        g, level = ctx.group, ctx.shared.level
        L, M, far = lengths(g)
        step = ctx.shared.context.fine_step(g.runs)
        shown = [c for c in sorted({g.grid[0], L, L + M, far, g.grid[-1]}) if c in g.grid]
        _, units = seed_losses(g.cells, g.at_contexts, g.grid)
        text = (
            f"How much context each model uses, against its own loss (Khandelwal et al. 2018; Sun et al. 2021): "
            f"every scored token sees exactly c previous tokens, c = {', '.join(map(str, g.grid))} (L = {L}, "
            f"M = {M}), models with memory through memory c with the same-length mask, models "
            f"without through a sliding window of c tokens, as far as the scheme serves it (`served`: where and why "
            f"not). `gap_c*`: the loss at c minus the model's own best ({g.unit_name}; each seed against its own best "
            f"c, then the mean over seeds with its {level:.0%} interval over seeds and the text's units, "
            f"`stats.mean_interval`; optimistic, since the best c is chosen on the same tokens). `c_eff`: the "
            f"**effective context length**, the smallest c whose loss is within {res.fraction:.0%} of the model's "
            f"own best, per seed (`c_eff_per_seed`) and their mean with a {level:.0%} percentile interval of a "
            f"cluster bootstrap over the {len(np.unique(units))} units and each cell's seeds "
            f"({ctx.shared.context.n_boot} replicates); '~' and '>=': c_eff is the last c served, so the curve had "
            f"not levelled off within the grid and c_eff is a lower bound. No other model enters: this is the "
            f"number to read for how far a model uses context (RECL's group baseline answers the paper's relative "
            f"question). Every c: `context_curves.csv`; every seed: `effective_context_seeds.csv`."
        )
        findings = []
        for a, b in _memory_pairs(g.cells):
            findings.append(
                f"Effective context of {a} minus {b} (tokens, the same bootstrap replicates; descriptive: the verdict "
                f"`memory_extends_xl_context` judges {a}'s own loss past L + M): "
                f"{interval_text(*res.difference(a, b), step)}."
            )
        gains = context_gain(g)
        for cell, x in gains.cells.items():
            change = float(np.mean(x)) * g.scale
            findings.append(
                f"{cell}: loss at c = {far} minus at c = {L + M}: {change:+.4f} {g.unit_name} (mean over seeds)"
            )
        if "verdicts" in ctx.report.sections and g is ctx.report.main:  # the verdicts judge the main corpus
            judged = ctx.report.measured("verdicts", None)
            findings += reach_lines(judged.verdicts, judged.scale, judged.unit_name, judged.power)
        keys = {c: runs[0] for c, runs in g.cells.items()}
        curves = res.curves.assign(
            scheme=lambda d: d["cell"].map(lambda c: keys[c].scheme),
            memory=lambda d: d["cell"].map(lambda c: bool(keys[c].recurrence)),
            full_loss=lambda d: d["cell"].map(lambda c: keys[c].loss_frac == 1.0),
            gap=lambda d: d["gap"] * g.scale,
            low=lambda d: d["low"] * g.scale,
            high=lambda d: d["high"] * g.scale,
        )
        settings = {c: _training_setting(runs[0]) for c, runs in g.cells.items()}
        freq = distances.frequency_table(settings)
        trained = distances.summary(freq, {c: v[0] for c, v in settings.items()})
        marks = {"L": L} if M == 0 else {"L": L, "L + M": L + M}
        figure = plots.context_curves(
            curves, ctx.file("context_curves.png"), marks, f"loss - own best ({g.figure})", level
        )
        return Part(
            text,
            [
                Table(
                    "table_effective_context",
                    table(res, g, shown, g.scale),
                    f"effective context (first c within {res.fraction:.0%} of the model's own best) and the loss gap "
                    f"to the own best at c = {', '.join(map(str, shown))} ({g.unit_name})",
                ),
                Table("context_curves", res.curves, "own-baseline curves at every c (nats)", show=False),
                Table("effective_context_seeds", res.seeds, "effective context of every seed", show=False),
                Table(
                    "table_training_distances",
                    trained,
                    "how often training scored each distance (STRING's diagnosis, An et al. 2025): the share of "
                    "training's (query, key) pairs at distance >= L, and the largest distance's frequency against "
                    "distance 0's (analysis/distances.py)",
                    {"share_at_or_past_L": 3, "largest_vs_0": 3},
                ),
                Table("training_distances", freq, "training pairs at every distance", show=False),
            ],
            [
                Figure(figure, f"loss at context c minus the model's own best ({g.figure}), one line per cell"),
                Figure(
                    plots.training_distances(freq, ctx.file("training_distances.png")),
                    "the share of training's (query, key) pairs at each distance",
                ),
            ],
            findings,
        )
