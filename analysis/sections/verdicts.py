"""The preregistered verdicts (conf/paper.yaml) and, apart, the sanity checks; again without the tokens that
could be recited (the data section's measurement), as a descriptive line."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from posenc_lab.data.overlap import WINDOW

from .. import evidence
from ..verdicts import Comparison, Verdict, judge, on_predicted_side, recheck
from .base import REPORT, Part, Section, Table, register


def _row(v: Verdict, scale: float, unit_name: str) -> dict:
    tested = [c for c in v.comparisons if not c.note]
    return {
        "verdict": v.id,
        "claim": v.claim,
        "status": v.status,
        "p_one_sided": v.p,
        "p_holm": v.p_adjusted,
        "interval_level": v.level,
        "comparisons": "; ".join(
            f"{c.text}: {c.difference.scaled(scale if v.measure != 'recall_beyond' else 1.0).text(3)}" for c in tested
        )
        + (f" ({unit_name if v.measure != 'recall_beyond' else 'accuracy'})" if tested else ""),
        "seeds": "; ".join(sorted({f"{c.difference.n_a}v{c.difference.n_b}" for c in tested})),
        "documents": min((c.difference.documents for c in tested), default=0),
        "not_tested": v.note,
        "paper": v.paper,
    }


def _sentence(v: Verdict, scale: float, unit_name: str) -> str:
    if not v.comparisons or all(c.note for c in v.comparisons):
        return f"**{v.claim}**: not tested ({v.note or 'no comparison could be made'})."
    parts = []
    for c in v.comparisons:
        if c.note:
            parts.append(f"{c.text}: not measured ({c.note})")
            continue
        d = c.difference.scaled(scale if v.measure != "recall_beyond" else 1.0)
        seeds = "" if d.covers_seeds else ", one seed: the text only"
        parts.append(f"{c.text} {d.text(3)}{seeds}")
    unit = unit_name if v.measure != "recall_beyond" else "accuracy"
    level = f"{v.level:.1%}" if v.level == v.level else "n/a"
    return (
        f"**{v.claim}**: **{v.status}** (predicted {v.predict}; {unit}, {level} intervals: "
        + "; ".join(parts)
        + f"; one-sided p {v.p:.2g}"
        + (f", Holm {v.p_adjusted:.2g}" if not v.sanity else "")
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
        held = all(on_predicted_side(c.difference, v.predict) for c in tested)
        shown = "; ".join(f"{c.text} {c.difference.scaled(scale).text(3)}" for c in tested)
        side = "every interval on the predicted side" if held else "not every interval on the predicted side"
        parts.append(f"*{v.claim}*: {shown} ({side})")
    if not parts:
        return ""
    return (
        f"Without what could be recited (descriptive): on the {kept:.1%} of the scored tokens whose preceding "
        f"{window} tokens never occur in train, at each verdict's level ({unit_name}): " + "; ".join(parts) + "."
    )


@dataclass
class Judged:
    verdicts: list[Verdict]
    sanity: list[Verdict]
    robustness: str  # the verdicts again without what could be recited ("" where not measured)
    scale: float  # of the main corpus's figure (1 without one)
    unit_name: str


TEXT = (
    "The findings this report judges were fixed in advance in `conf/paper.yaml`, each with the sign it "
    "predicts and the comparison that decides it, and they are judged on the **test** split. Every comparison "
    "is the difference of two cells' mean per-token loss (or accuracy) on the same tokens, with an interval "
    "whose units are the training seed and the document (`posenc_lab_analysis.stats.paired_difference`). A "
    "verdict made of several comparisons is reproduced only if each of them is, contradicted if any one is the "
    "other way. Holm's correction runs over both directions of every verdict at once, so that the chance of any "
    "false *reproduced* or *contradicted* is at most the alpha of `conf/paper.yaml`. Each verdict's intervals "
    "are shown at the level of the Holm step that decided it (or, if Holm stopped before it, of the step where "
    "it stopped), so that a verdict is *reproduced* exactly when every interval lies on its predicted side. "
    "*Inconclusive*: neither; *not judged: one seed*: a cell it needs has one seed (descriptive only); *not "
    "tested*: a cell it needs was not trained, or a value was not finite. Every other interval in this report "
    "is descriptive."
)


@register
class Verdicts(Section):
    name = "verdicts"
    title = "Verdicts (preregistered, test split, Holm-corrected)"
    scope = REPORT

    def measure(self, ctx) -> Judged:
        report, main = ctx.report, ctx.report.main
        judged, sanity = judge(report.paper, report.evidence, smoke=report.smoke)
        line = ""
        if main is not None and "as_trained" in report.evidence:  # again without the tokens that could be recited
            held_out = ctx.measured("data")
            kept = evidence.restricted(report.evidence["as_trained"], ~held_out.shared)
            again = recheck(report.paper, judged, {"as_trained": kept})
            line = robustness(again, float((~held_out.shared).mean()), WINDOW, main.scale, main.unit_name)
        scale, unit_name = (main.scale, main.unit_name) if main else (1.0, "nats")
        return Judged(judged, sanity, line, scale, unit_name)

    def render(self, ctx, m: Judged) -> Part:
        corpora = ctx.report.corpora
        notes = (
            [f"Verdicts on corpus `{corpora[0].name}`; the other corpora are descriptive."] if len(corpora) > 1 else []
        )
        findings = [_sentence(v, m.scale, m.unit_name) for v in m.verdicts]
        if m.sanity:
            findings.append(
                "Sanity checks (true by construction, not counted as reproductions): "
                + " ".join(_sentence(v, m.scale, m.unit_name) for v in m.sanity)
            )
        if m.robustness and not ctx.report.smoke:
            findings.append(m.robustness)
        df = pd.DataFrame([_row(v, m.scale, m.unit_name) for v in m.verdicts + m.sanity])
        if len(df):
            df.insert(1, "kind", ["verdict"] * len(m.verdicts) + ["sanity check"] * len(m.sanity))
        return Part(
            TEXT,
            [Table("table_verdicts", df, "every verdict and sanity check", show=False)],
            findings=findings,
            notes=notes,
        )
