"""The length-generalization section: per task, cell (scheme, memory) and test length, exact-match accuracy per
instance and per answer token with intervals over seeds and instances; a figure of accuracy against length, a
panel per task; where a scheme cannot serve a length, and why; and the verdicts fixed in advance in
conf/lengthgen_paper.yaml (``analysis/lengthgen.py`` measures and judges)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import yaml

from posenc_lab import config_dir
from posenc_lab.data.lengthgen import TASKS
from posenc_lab.tables import write_csv

from ..lengthgen import METRICS, PAST, Claim, competence, estimands, judge, measure, tidy
from ..plots import _save, palette
from .base import REPORT, Figure, Part, Section, Table, register

CLAIM_KEYS = {"id", "task", "better", "than", "factor", "claim", "source"}


def read_claims(name: str) -> tuple[list[Claim], float]:
    """The claims of ``conf/<name>`` and its alpha; ValueError in one line naming the file and the bad entry
    (its competence gate too, ``read_gate``)."""
    path = Path(config_dir()) / name
    where = f"ablate.analysis.lengthgen.claims={name}"
    if not path.is_file():
        raise ValueError(f"{where}: no file {path}; e.g. lengthgen_paper.yaml (a file of conf/)")
    doc = yaml.safe_load(path.read_text()) or {}
    alpha = doc.get("alpha", 0.05)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise ValueError(f"{where}: alpha must be in (0, 1), got {alpha!r}")
    claims = []
    for i, c in enumerate(doc.get("claims") or []):
        if not isinstance(c, dict) or not CLAIM_KEYS <= set(c) <= CLAIM_KEYS | {"metric"}:
            got = sorted(c) if isinstance(c, dict) else c
            raise ValueError(
                f"{where}: claim {i} must have exactly the keys {sorted(CLAIM_KEYS)} (and optionally metric), got {got}"
            )
        if (metric := c.get("metric", "sequence")) not in METRICS:
            raise ValueError(f"{where}: claim {c['id']}: metric must be one of {list(METRICS)}, got {metric!r}")
        if c["task"] not in TASKS:
            raise ValueError(f"{where}: claim {c['id']}: task {c['task']!r} is not a task; the tasks: {sorted(TASKS)}")
        f = c["factor"]
        if f != PAST and (isinstance(f, bool) or not isinstance(f, int) or f < 1 or f & (f - 1)):
            raise ValueError(
                f"{where}: claim {c['id']}: factor must be a power of 2 (a test length) or {PAST!r} (every test "
                f"length past training, each alike: Ruoss et al.'s average), got {f!r}"
            )
        source = " ".join(str(c["source"]).split())
        claims.append(Claim(c["id"], c["task"], c["better"], c["than"], f, source, c["claim"], metric))
    read_gate(name)
    return claims, float(alpha)


def read_gate(name: str) -> float | None:
    """The competence gate of ``conf/<name>`` (``competence``): the exact match per instance on validation at the
    training length that both cells of a claim must reach to be judged; None: no gate."""
    doc = yaml.safe_load((Path(config_dir()) / name).read_text()) or {}
    gate = doc.get("competence")
    if gate is not None and (isinstance(gate, bool) or not isinstance(gate, (int, float)) or not 0 < gate <= 1):
        raise ValueError(f"ablate.analysis.lengthgen.claims={name}: competence must be in (0, 1] or null, got {gate!r}")
    return None if gate is None else float(gate)


def plan_lines(cell_seeds: dict[str, int], claims_file: str, instances: int) -> list[str]:
    """The plan's power statement for a task grid (``power.task_plan_lines``): ``cell_seeds`` the grid's task
    cells (``<task>/<cell>``) and their seeds; the claims of ``claims_file`` judged on it (both cells present with
    at least 2 seeds, as ``judge`` judges them); ``instances`` test instances a length; the seed SD of
    ``plan_seed_sd`` in that file."""
    from ..power import task_plan_lines

    if not cell_seeds:
        return []
    claims, alpha = read_claims(claims_file)
    seed_sd = (yaml.safe_load((Path(config_dir()) / claims_file).read_text()) or {}).get("plan_seed_sd", 0.0)
    if isinstance(seed_sd, bool) or not isinstance(seed_sd, (int, float)) or not 0 <= seed_sd < 0.5:
        raise ValueError(f"{claims_file}: plan_seed_sd must be a number in [0, 0.5), got {seed_sd!r}")
    n = sum(
        min(cell_seeds.get(f"{c.task}/{c.better}", 0), cell_seeds.get(f"{c.task}/{c.than}", 0)) >= 2 for c in claims
    )
    return task_plan_lines(n, sorted(set(cell_seeds.values())), instances, alpha, float(seed_sd), claims_file)


@dataclass
class LengthgenSettings:
    """``ablate.analysis.lengthgen``: the test instances evaluated per length (None: all of the split's) and the
    file of conf/ holding the verdicts fixed in advance."""

    max_instances: int | None
    claims: str

    def __post_init__(self):
        if self.max_instances is not None and self.max_instances < 1:
            raise ValueError(
                f"ablate.analysis.lengthgen.max_instances must be >= 1 (or null: all), got {self.max_instances!r}"
            )
        read_claims(self.claims)  # a bad claims file is named before any training


def summary(t: pd.DataFrame) -> pd.DataFrame:
    """One row per task and cell: exact-match accuracy at each factor, the intervals at 4x (the longest factor
    below where no 4x was tested), and the first length it cannot serve, with why."""
    rows = []
    for cell, g in t.groupby("cell", sort=False):
        row = {"cell": cell, "seeds": int(g["seeds"].max())}  # the cell's name holds its task
        for _, r in g.iterrows():
            row[f"seq_{r['factor']}x"] = r["seq_acc"]
        ref = g[g["factor"] == 4] if (g["factor"] == 4).any() else g[g["factor"] == g["factor"].max()]
        r = ref.iloc[0]
        row[f"seq_{r['factor']}x_interval"] = _interval(r, "seq")
        row[f"token_{r['factor']}x_interval"] = _interval(r, "token")
        gone = g[g["not_served"] != ""]
        row["not_served"] = f"from length {gone['length'].min()}: {gone['not_served'].iloc[0]}" if len(gone) else ""
        rows.append(row)
    return pd.DataFrame(rows)


def _factor(factor) -> str:
    return "every length past n_train" if factor == PAST else f"{factor}x"


def _shown(estimands: pd.DataFrame) -> pd.DataFrame:
    """The estimands with Ruoss's average and its interval in one column."""
    if estimands.empty:
        return estimands
    out = estimands.copy()
    out["ruoss"] = [
        "n/a" if not np.isfinite(a) else f"{a:.3f} [{lo:.3f}, {hi:.3f}]"
        for a, lo, hi in zip(out["ruoss"], out["ruoss_low"], out["ruoss_high"])
    ]
    return out.drop(columns=["ruoss_low", "ruoss_high"])


def _interval(r, kind: str) -> str:
    if not np.isfinite(r[f"{kind}_acc"]):
        return "n/a"
    return f"{r[f'{kind}_acc']:.3f} [{r[f'{kind}_low']:.3f}, {r[f'{kind}_high']:.3f}]"


def line_style(scheme: str) -> tuple[str, str]:
    """A cell's colour key and marker in the figure: random positions (``+rand<P>``) keep the colour of the cell
    without them and draw squares; any other mark (``+abacus``, ``+sink``) is a cell of its own colour."""
    random = re.fullmatch(r"(.+)\+rand\d+", scheme)
    return (random.group(1), "s") if random else (scheme, "o")


def figure(t: pd.DataFrame, path: Path) -> Path:
    """Accuracy against the test length, a panel per task: exact match per instance (top row) and per answer
    token (bottom row; a task learned in part shows there first); a colour per scheme with its marks (squares:
    with random positions, ``line_style``), solid with memory, dashed without; bars: the intervals; not-served
    lengths left out."""
    t = t[np.isfinite(t["seq_acc"])].copy()
    tasks = list(dict.fromkeys(t["task"]))
    colours = palette(list(dict.fromkeys(line_style(s)[0] for s in t["scheme"])))
    n = max(1, len(tasks))
    fig, axes = plt.subplots(2, n, figsize=(4.2 * n, 6.6), squeeze=False, sharex=True)
    factors = sorted(set(t["factor"]))
    for row, (kind, label) in enumerate((("seq", "exact match per instance"), ("token", "accuracy per answer token"))):
        for ax, task in zip(axes[row], tasks):
            for cell, g in t[t["task"] == task].groupby("cell", sort=False):
                g = g.sort_values("factor")
                colour_key, marker = line_style(g["scheme"].iloc[0])
                acc, low, high = g[f"{kind}_acc"], g[f"{kind}_low"].clip(lower=0), g[f"{kind}_high"].clip(upper=1)
                ax.errorbar(
                    g["factor"],
                    acc,
                    # an interval need not hold its mean (a skewness-corrected one): no negative bar
                    yerr=[np.maximum(acc - low, 0), np.maximum(high - acc, 0)],
                    color=colours[colour_key],
                    ls="-" if g["memory"].iloc[0] else "--",
                    marker=marker,
                    ms=3,
                    lw=1,
                    capsize=2,
                    label=cell.split("/", 1)[-1],
                )
            ax.set_xscale("log", base=2)
            ax.set_xticks(factors, [f"{f}x" for f in factors])
            ax.minorticks_off()
            ax.set_ylim(-0.02, 1.02)
            ax.set_title(task if row == 0 else "")
            if row == 1:
                ax.set_xlabel("test length (x n_train)")
        axes[row, 0].set_ylabel(label)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7, frameon=False)
    fig.suptitle("Length generalization (solid: with memory; dashed: without; squares: random positions)", y=1.01)
    sns.despine(fig)
    return _save(fig, path)


@dataclass
class LengthgenMeasured:
    table: pd.DataFrame  # one row per task, cell and test length
    verdicts: pd.DataFrame
    estimands: pd.DataFrame  # one row per task and cell: Ruoss's and Kazemnejad's summaries past n_train
    ranks: pd.DataFrame  # one row per cell: its mean rank over the tasks (Kazemnejad's)
    gate: float | None  # the competence gate the verdicts were judged under


@register
class Lengthgen(Section):
    name = "lengthgen"
    title = "Length generalization"
    scope = REPORT
    Settings = LengthgenSettings

    def measure(self, ctx) -> LengthgenMeasured | None:
        runs = [r for r in ctx.report.runs if r.corpus_name in TASKS]
        if not runs:
            return None
        ctx.log(f"analysis: {len(runs)} runs of length-generalization tasks")
        level = ctx.shared.level
        measured = measure(runs, ctx.shared.split, ctx.settings.max_instances, ctx.log)
        table = tidy(measured, level)
        claims, alpha = read_claims(ctx.settings.claims)
        gate = read_gate(ctx.settings.claims)
        named = {f"{c.task}/{cell}" for c in claims for cell in (c.better, c.than)}
        in_distribution = competence(runs, named, ctx.settings.max_instances, ctx.log) if gate is not None else None
        verdicts = judge(claims, measured, level, alpha, in_distribution, gate)
        per_cell, ranks = estimands(measured, level)
        write_csv(table, ctx.file("lengthgen/lengthgen_accuracy.csv"))
        write_csv(per_cell, ctx.file("lengthgen/lengthgen_estimands.csv"))
        return LengthgenMeasured(table, verdicts, per_cell, ranks, gate)

    def render(self, ctx, m: LengthgenMeasured | None) -> Part | None:
        if m is None:  # no task run (e.g. the default ablation): the section is not shown
            return None
        level = f"{ctx.shared.level:.0%}"
        path = figure(m.table, ctx.file("lengthgen/lengthgen_accuracy.png"))
        text = (
            f"Each task's {ctx.shared.split} instances at n_train, 2, 4 and 8 x n_train (inputs training never saw; "
            "training: lengths 1..n_train): with memory after the instance before it (as training streams them: the "
            "memory is never empty when an instance starts), in segments of the training length L through the "
            "memory; without memory alone after an end token, in one window holding the whole instance (as "
            "the published suites test; an instance aligned to segments and shorter than one is read in a "
            "segment's window, pads after it, as training placed it). Answers only are scored. `seq_*`: exact "
            "match per instance (every answer token the model's argmax), by test length; intervals "
            f"{level} over seeds and instances (`analysis/stats.py`'s mean_interval; the instances are the units), "
            "per instance (`seq`) and per answer token (`token`). `not_served`: the first length a cell's scheme "
            "cannot serve, and why (nothing is measured there). Every task, cell and length: "
            f"`lengthgen/lengthgen_accuracy.csv`. The verdicts: conf/{ctx.settings.claims}, fixed in advance; "
            "the accuracy (`metric`: exact match per instance, or per answer token) of `better` minus `than` on the "
            "same instances, Holm over both directions of every claim judged (a claim the gate withheld counts, with "
            "p = 1); each claim's interval at the level of the "
            "Holm step that decided it (named beside it)."
            + (
                f" A claim is judged only where both of its cells reach the gate: exact match per instance on the "
                f"validation split at n_train (in distribution) of at least {gate:g}, the mean over the cell's seeds "
                f"(`competence` in {ctx.settings.claims}, fixed with the claims; `in_distribution`: better's / "
                "than's); otherwise it says `did not learn`."
                if (gate := m.gate) is not None
                else ""
            )
            + " The papers' own summaries past n_train (`table_lengthgen_estimands`): Ruoss et al. 2023 (Table 1) "
            "average the accuracy per answer token over the test lengths, each length weighing the same, and report "
            "the best seed: `ruoss` is that average, the mean over seeds with its interval, `ruoss_best_seed` their "
            "statistic (their lengths: every one past training; here the doubling ones). Kazemnejad et al. 2023 "
            "(Fig. 3) score exact match by length bucket (the `seq_*` columns above) and rank the encodings: "
            "`kazemnejad_exact` is the exact match averaged over the buckets past n_train, `rank_in_task` the "
            "cell's rank by it (1: best), and `table_lengthgen_ranks` the mean rank over the tasks."
        )
        notes = ["smoke run: the numbers mean nothing and no verdict is drawn"] if ctx.report.smoke else []
        verdicts = m.verdicts.copy()
        if ctx.report.smoke:
            verdicts["verdict"] = "not judged (smoke run)"
        findings = [
            f"{r['claim']} ({r['task']}, {_factor(r['factor'])}): {r['verdict']}" for _, r in verdicts.iterrows()
        ]
        for cell, g in m.table[m.table["not_served"] != ""].groupby("cell", sort=False):
            findings.append(f"not served: {cell} from length {g['length'].min()}: {g['not_served'].iloc[0]}")
        tables = [
            Table("table_lengthgen", summary(m.table), "exact-match accuracy by test length (x n_train)"),
            Table("table_lengthgen_verdicts", verdicts, f"the verdicts of {ctx.settings.claims}"),
            Table("table_lengthgen_estimands", _shown(m.estimands), "the papers' summaries past n_train, per cell"),
            Table("table_lengthgen_ranks", m.ranks, "mean rank over the tasks (Kazemnejad et al. 2023's summary)"),
            Table("table_lengthgen_lengths", m.table, "every task, cell and length", show=False),
        ]
        return Part(
            text,
            tables,
            [
                Figure(
                    path,
                    "exact match (top) and accuracy per answer token (bottom) against test length, a panel per task",
                )
            ],
            findings,
            notes,
        )
