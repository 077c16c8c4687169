"""The preregistered verdicts (conf/paper.yaml) and, apart, the controls (true by construction: a failure is a
defect of the run); the verdicts again without the tokens that could be recited (the data section's measurement),
as a descriptive line."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from scipy import stats as scipy_stats

from posenc_lab.data.overlap import WINDOW

from .. import evidence
from ..power import POWER, verdict_detectable, verdict_power
from ..stats import p_text
from ..verdicts import DEFECT, Comparison, Verdict, judge, on_predicted_side, paper, recheck
from .base import REPORT, Part, Section, Table, register


def _df(tested: list[Comparison]) -> float:
    return min((c.difference.df for c in tested), default=float("nan"))


def detectable(v: Verdict, units) -> float:
    """The effect (in nats, or accuracy) the verdict finds with 80% power at the level Holm tested it at, from
    the seeds and units (``units`` [tokens]: its evidence's) it had, its test simulated as it is run
    (``power.verdict_detectable``); NaN where it was not judged."""
    tested = [c for c in v.comparisons if not c.note]
    if not tested or v.level != v.level or not all(c.difference.covers_seeds for c in tested):
        return float("nan")
    alone = [" - " not in c.text for c in tested]  # a cell against zero: its seeds paired
    return verdict_detectable([c.difference for c in tested], alone, units, (1 - v.level) / 2, pooled_df=_pooled(v))


def _pooled(v: Verdict) -> int:
    """The df of the pooled seed variance the verdict was judged with (0: each cell its own)."""
    return v.pooling.df if v.pooling is not None and v.pooling.seed_var is not None else 0


def power_at_measured(v: Verdict, units) -> float:
    """The chance the verdict's test, as run, finds every comparison were each true difference the size measured
    (``power.verdict_power``); NaN where it was not judged."""
    tested = [c for c in v.comparisons if not c.note]
    if not tested or v.level != v.level or not all(c.difference.covers_seeds for c in tested):
        return float("nan")
    alone = [" - " not in c.text for c in tested]
    bounds = [c.bound for c in tested]
    return verdict_power([c.difference for c in tested], alone, bounds, units, (1 - v.level) / 2, _pooled(v))


def _why_far(v: Verdict, power: float) -> str:
    """Why a detectable effect lies far past every interval: a cell with 2 seeds gives its seed part 1 df, where a
    one-sided t at Holm's level is in the tens or hundreds, so in the simulated studies whose seed part dominates
    nothing short of a huge effect is found (``pooling.py``). Empty where the figure is not of that kind."""
    tested = [c.difference for c in v.comparisons if not c.note]
    fewest = min((n for d in tested for n in (d.n_a, d.n_b) if n), default=0)
    widest = max(((d.high - d.low) / 2 for d in tested), default=float("nan"))
    if fewest != 2 or not power == power or not power > 5 * widest:
        return ""
    t_one = scipy_stats.t.ppf(1 - (1 - v.level) / 2, 1)
    return (
        f" (far past the intervals because a cell has 2 seeds: its seed part has 1 df, a one-sided t of "
        f"{t_one:.0f} at this level, in the studies where it holds most of the variance; 3 seeds a cell would "
        f"give it 2; read the power at the measured size)"
    )


def _row(v: Verdict, scale: float, unit_name: str, power: float = float("nan"), measured: float = float("nan")) -> dict:
    tested = [c for c in v.comparisons if not c.note]
    k = scale if v.measure != "recall_beyond" else 1.0
    return {
        "verdict": v.id,
        "claim": v.claim,
        "status": v.status,
        "p_one_sided": p_text(v.p, _df(tested)),
        "p_holm": p_text(v.p_adjusted, _df(tested)),
        "interval_level": v.level,
        "comparisons": "; ".join(
            f"{c.text}: {c.difference.scaled(scale if v.measure != 'recall_beyond' else 1.0).text(3)}" for c in tested
        )
        + (f" ({unit_name if v.measure != 'recall_beyond' else 'accuracy'})" if tested else ""),
        "seeds": "; ".join(sorted({f"{c.difference.n_a}v{c.difference.n_b}" for c in tested})),
        "units": min((c.difference.units for c in tested), default=0),
        "largest_unit_share": max((c.difference.largest_share for c in tested), default=float("nan")),
        f"detectable_{POWER:.0%}_power": power * k,
        "power_at_measured": measured,
        "seed_variance": "pooled" if _pooled(v) else "each cell's own",
        "expands": v.expands,
        "not_tested": v.note,
        "paper": v.paper,
    }


def _sentence(
    v: Verdict, scale: float, unit_name: str, power: float = float("nan"), measured: float = float("nan")
) -> str:
    if not v.comparisons or all(c.note for c in v.comparisons):
        return f"**{v.claim}**: not tested ({v.note or 'no comparison could be made'})."
    parts = []
    for c in v.comparisons:
        if c.note:
            parts.append(f"{c.text}: not measured ({c.note})")
            continue
        k = scale if v.measure != "recall_beyond" else 1.0
        d = c.difference.scaled(k)
        seeds = "" if d.covers_seeds else ", one seed: the text only"
        own = c.bound or c.predict not in ("", v.predict)  # a comparison that predicts other than its verdict
        bound = f", predicted {c.predict or v.predict} {c.bound * k:+.3g}" if own else ""
        parts.append(f"{c.text} {d.text(3)}{seeds}{bound}")
    unit = unit_name if v.measure != "recall_beyond" else "accuracy"
    level = f"{v.level:.1%}" if v.level == v.level else "n/a"
    tested = [c for c in v.comparisons if not c.note]
    units = min((c.difference.units for c in tested), default=0)
    k = scale if v.measure != "recall_beyond" else 1.0
    return (
        f"**{v.claim}**: **{v.status}** (predicted {v.predict}; {unit}, {level} intervals over seeds and {units} "
        f"text units: "
        + "; ".join(parts)
        + f"; one-sided p {p_text(v.p, _df(tested))}"
        + (f", Holm {p_text(v.p_adjusted, _df(tested))}" if not v.control else "")
        + (f"; detectable at {POWER:.0%} power: {power * k:.3g}" if power == power and not v.control else "")
        + (_why_far(v, power) if not v.control else "")
        + (f"; power at the measured size: {measured:.2f}" if measured == measured and not v.control else "")
        + (f"; {v.note}" if v.control and v.note else "")
        + (f"; {v.expands}" if v.expands else "")
        + ")"
        + (f". Paper: {v.paper}." if v.paper else ".")
    )


def robustness(
    rechecked: list[tuple[Verdict, list[Comparison]]], kept: float, window: int, scale: float, unit_name: str
) -> str:
    """One line: the as-trained verdicts again without the tokens whose context occurs in train."""
    parts = []
    for v, comps in rechecked:
        tested = [c for c in comps if not c.note]
        if not tested:
            continue
        held = all(on_predicted_side(c.difference, c.predict or v.predict, c.bound) for c in tested)
        shown = "; ".join(f"{c.text} {c.difference.scaled(scale).text(3)}" for c in tested)
        side = "every interval on the predicted side" if held else "not every interval on the predicted side"
        parts.append(f"*{v.claim}*: {shown} ({side})")
    if not parts:
        return ""
    return (
        f"Without what could be recited (descriptive): on the {kept:.1%} of the scored tokens whose preceding "
        f"{window} tokens never occur in train, at each verdict's level ({unit_name}): " + "; ".join(parts) + "."
    )


def restricted(config: dict, only: list[str] | None) -> tuple[dict, list[str]]:
    """(conf/paper.yaml with only the verdicts ``only`` names, the ids it left out); ``only`` None: all of them.
    A preset made for one question judges that one alone: the others' cells may be there (contrast cells), but a
    verdict it was not made for would join Holm's family and cost the question its level."""
    if only is None:
        return config, []
    ids = [v["id"] for v in config.get("verdicts") or []]
    if unknown := [x for x in only if x not in ids]:
        raise ValueError(
            f"ablate.analysis.verdicts.only: {', '.join(map(repr, unknown))} not a verdict of "
            f"conf/paper.yaml; the verdicts are: {', '.join(ids)}"
        )
    kept = [v for v in config["verdicts"] if v["id"] in only]
    return {**config, "verdicts": kept}, [x for x in ids if x not in only]


@dataclass
class Judged:
    verdicts: list[Verdict]
    controls: list[Verdict]  # true by construction (conf/paper.yaml's controls), out of Holm's family
    robustness: str  # the verdicts again without what could be recited ("" where not measured)
    scale: float  # of the main corpus's figure (1 without one)
    unit_name: str
    power: dict[str, float]  # verdict id -> its detectable effect (nats, or accuracy; NaN: not judged)
    measured_power: dict[str, float]  # verdict id -> its power were the true differences the size measured
    left_out: list[str]  # verdicts of conf/paper.yaml this report does not judge (``only``)


TEXT = (
    "The findings this report judges were fixed in advance in `conf/paper.yaml`, each with the sign it "
    "predicts and the comparison that decides it, and they are judged on the **test** split. Every comparison "
    "is the difference of two cells' mean per-token loss (or accuracy) on the same tokens, with an interval "
    "whose units are the training seed and the text's independent unit: the family on a corpus split by family "
    "(a package, or files sharing windows), the document elsewhere (`posenc_lab_analysis.stats.paired_difference`: "
    "CR2 with Bell-McCaffrey degrees of freedom, so that a family holding much of the text widens it). "
    "Seed s of every cell shares its initialisation and data order, yet the seeds are analysed as independent: "
    "measured on the default ablation, the seed means of two cells do not correlate (-0.08; a positive "
    "correlation would make the intervals conservative; analysis/README.md, the estimator). A "
    "verdict made of several comparisons is reproduced only if each of them is, contradicted if any one is the "
    "other way. Holm's correction runs over both directions of every verdict at once, so that the chance of any "
    "false *reproduced* or *contradicted* is at most the alpha of `conf/paper.yaml`. Each verdict's intervals "
    "are shown at the level of the Holm step that decided it (or, if Holm stopped before it, of the step where "
    "it stopped), so that a verdict is *reproduced* exactly when every interval lies on its predicted side. "
    "*Inconclusive*: neither; *not judged: one seed*: a cell it needs has one seed (descriptive only); *not "
    "tested*: a cell it needs was not trained, or a value was not finite. Every other interval in this report "
    "is descriptive. **Controls** (`controls` of conf/paper.yaml, their own table): results true by construction "
    "of the run (memory narrows the loss gap at a segment's start, the recall probe needs memory, global positions "
    "past the training episodes were never seen), each tested at alpha without correction, out of Holm's family, "
    "never counted as reproductions: *holds*, or *failed: a defect of the run* (too few steps, a bug), never a "
    "finding about the paper. `detectable_80%_power`: the effect, the same in each comparison, that the verdict would "
    "find with 80% power at its Holm level, from the seeds and units it had: its test simulated as it is run, "
    "with the estimated degrees of freedom, at the measured components' shape scaled to each comparison's own "
    "standard error (`power.py`); `power_at_measured`: the chance the same test finds every comparison were the "
    "true differences the size measured (where the power curve is flat, the 80% point can lie far past every "
    "effect in sight). Seed variances: within each measure, Bartlett's test of equal seed variances over the "
    "cells with 2 or more seeds, reported below; where `seed_variance.pool` of conf/paper.yaml is true and the "
    "test does not reject, one seed SD is pooled (its df the sum of theirs), else each cell keeps its own."
)


@register
class Verdicts(Section):
    name = "verdicts"
    title = "Verdicts (preregistered, test split, Holm-corrected)"
    scope = REPORT

    @dataclass
    class Settings:
        only: list[str] | None  # the ids of conf/paper.yaml's verdicts this report judges (None: every one)

        def __post_init__(self):  # checked before any training, against the file `posenc-lab ablate` reads
            if self.only is not None:
                if not self.only:
                    raise ValueError("ablate.analysis.verdicts.only must name at least one verdict, or be null (all)")
                restricted(paper(), self.only)

    def measure(self, ctx) -> Judged:
        report, main = ctx.report, ctx.report.main
        config, left_out = restricted(report.paper, ctx.settings.only if ctx.settings else None)
        judged, controls = judge(config, report.evidence, smoke=report.smoke)
        line = ""
        if main is not None and "as_trained" in report.evidence:  # again without the tokens that could be recited
            held_out = ctx.measured("data")
            kept = evidence.restricted(report.evidence["as_trained"], ~held_out.shared)
            again = recheck(config, judged, {"as_trained": kept})
            line = robustness(again, float((~held_out.shared).mean()), WINDOW, main.scale, main.unit_name)
        scale, unit_name = (main.scale, main.unit_name) if main else (1.0, "nats")
        power, measured = {}, {}
        for v in judged:
            if v.measure in report.evidence and not report.smoke:
                units = report.evidence[v.measure].documents
                power[v.id], measured[v.id] = detectable(v, units), power_at_measured(v, units)
        return Judged(judged, controls, line, scale, unit_name, power, measured, left_out)

    def render(self, ctx, m: Judged) -> Part:
        corpora = ctx.report.corpora
        notes = (
            [f"Verdicts on corpus `{corpora[0].name}`; the other corpora are descriptive."] if len(corpora) > 1 else []
        )
        if m.left_out:
            notes.append(
                f"This preset judges only {', '.join(f'`{v.id}`' for v in m.verdicts)} "
                f"(`ablate.analysis.verdicts.only`): Holm's family is that alone. Left out, not judged here: "
                f"{', '.join(f'`{x}`' for x in m.left_out)}."
            )
        nan = float("nan")
        findings = [
            _sentence(v, m.scale, m.unit_name, m.power.get(v.id, nan), m.measured_power.get(v.id, nan))
            for v in m.verdicts
        ]
        tests = {v.pooling.measure: v.pooling for v in m.verdicts + m.controls if v.pooling is not None}
        if tests:
            findings.append(
                "Seed variances (`conf/paper.yaml` seed_variance; `pooling.py`): "
                + "; ".join(t.text(m.scale, m.unit_name) for t in tests.values())
                + ". Pooled, a verdict's seed part has the pool's df instead of 1-2 per cell; not pooled by default, "
                "since at 2-3 seeds the test cannot see seed SDs that differ (`pooling.py`)."
            )
        if m.robustness and not ctx.report.smoke:
            findings.append(m.robustness)
        if m.controls:
            findings.append(controls_line(m.controls, m.scale, m.unit_name))
        claims = pd.DataFrame(
            [_row(v, m.scale, m.unit_name, m.power.get(v.id, nan), m.measured_power.get(v.id, nan)) for v in m.verdicts]
        )
        tables = [Table("table_verdicts", claims, "every verdict (the paper's claims, Holm's family)", show=False)]
        if m.controls:
            tables.append(Table("table_controls", control_table(m.controls, m.scale, m.unit_name), CONTROLS_CAPTION))
        return Part(TEXT, tables, findings=findings, notes=notes)


CONTROLS_CAPTION = "controls: expected to hold; a failure is a defect of the run"


def control_table(controls: list[Verdict], scale: float, unit_name: str) -> pd.DataFrame:
    """A row per control: its claim, whether it holds, its comparisons with their intervals, and why not."""
    rows = [
        {k: _row(c, scale, unit_name)[k] for k in ("verdict", "claim", "status", "p_one_sided", "comparisons", "seeds")}
        | {"why": c.note}
        for c in controls
    ]
    return pd.DataFrame(rows, columns=["verdict", "claim", "status", "p_one_sided", "comparisons", "seeds", "why"])


def controls_line(controls: list[Verdict], scale: float, unit_name: str) -> str:
    """The controls apart from the claims: each with its reading, and a plain warning where one failed."""
    failed = [c.id for c in controls if c.status == DEFECT]
    head = (
        f"**Controls failed: {', '.join(f'`{x}`' for x in failed)}: a defect of the run** (each is true by "
        "construction: read the verdicts above with that in mind). "
        if failed
        else ""
    )
    return (
        head + "Controls (expected to hold; a failure is a defect of the run; not claims of the paper, out of Holm's "
        "family): " + " ".join(_sentence(c, scale, unit_name) for c in controls)
    )
