"""The preregistered verdicts of ``conf/paper.yaml``, judged on the test split with Holm's correction.

Every verdict predicts the sign of one or more comparisons ``a - b`` of cells (or of ``a`` against zero).
A comparison is ``stats.paired_difference`` of the cells' per-token values on the same tokens, with seeds
and documents as the units. A verdict of several comparisons is reproduced only if each is (intersection-
union: its one-sided p-value is the largest of theirs). Holm's step-down procedure over the verdicts
decides "reproduced" at ``alpha``; over the verdicts left, the same in the opposite direction decides
"contradicted" (a comparison's opposite p-value times the verdict's number of comparisons: any one of them
contradicts it). The rest are "inconclusive". Each comparison's interval is shown at the level at which
Holm tested its verdict (two-sided 1 - 2 alpha_i), so that an interval on the predicted side is exactly a
reproduction. Sanity checks (true by construction) are computed alike and shown apart, never counted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from posenc_lab import config_dir

from .cellnames import CellName, CellPattern
from .stats import NOT_EVALUATED, Difference, holm, paired_difference

REPRODUCED, CONTRADICTED, INCONCLUSIVE, NOT_TESTED = "reproduced", "contradicted", "inconclusive", "not tested"
SMOKE = "not judged (smoke run)"


def paper(path: str | Path | None = None) -> dict:
    """conf/paper.yaml: the verdicts, alpha, the paper's reference figures."""
    return yaml.safe_load(Path(path or Path(config_dir()) / "paper.yaml").read_text())


@dataclass
class Evidence:
    """Per-cell, per-seed values of one measure on shared tokens: cells: name -> [n_seeds, tokens];
    keys: name -> its ``cellnames.CellName``; documents: [tokens]; unavailable: name -> why the cell has no values.
    ``paired``: a comparison of a cell with itself at another length (the seeds are the same runs)."""

    cells: dict[str, np.ndarray]
    keys: dict[str, CellName]
    documents: np.ndarray
    unavailable: dict[str, str] = field(default_factory=dict)


@dataclass
class Comparison:
    text: str
    difference: Difference
    note: str = ""  # why it was not tested
    blocks: bool = False  # a cell it names was not trained (or is ambiguous): the verdict cannot be tested

    def p(self, predict: str) -> float:
        return self.difference.p_value(predict) if np.isfinite(self.difference.estimate) else float("nan")


@dataclass
class Verdict:
    id: str
    claim: str
    measure: str
    predict: str
    paper: str
    comparisons: list[Comparison]
    status: str = NOT_TESTED
    p: float = float("nan")  # intersection-union one-sided p
    p_adjusted: float = float("nan")
    level: float = float("nan")  # of the intervals shown
    sanity: bool = False
    note: str = ""


def _expand(side: str, keys: dict[str, CellName], exclude: str | None) -> list[str]:
    """Cell names matching one side of a comparison (a pattern of ``cellnames``: ``xl:mem``, ``absolute:mem``,
    ``*``), but ``exclude``."""
    pattern = CellPattern.parse(side, "conf/paper.yaml")
    return [n for n, k in keys.items() if n != exclude and pattern.matches(k)]


def comparisons(spec: list[str], evidence: Evidence, measure_of: Callable) -> list[Comparison]:
    """Every comparison a verdict's ``compare`` list names, each with its Difference (or why not)."""
    out = []
    for text in spec:
        a_text, _, b_text = (t.strip() for t in text.partition(" - "))
        a_names = _expand(a_text, evidence.keys, None)
        if len(a_names) != 1:
            why = "no such cell was trained" if not a_names else f"several cells match: {', '.join(a_names)}"
            out.append(Comparison(text, NOT_EVALUATED, why, blocks=True))
            continue
        a = a_names[0]
        b_names = _expand(b_text, evidence.keys, a) if b_text else [None]
        if not b_names:
            out.append(Comparison(text, NOT_EVALUATED, "no such cell was trained", blocks=True))
        for b in b_names:
            label = f"{a} - {b}" if b else a
            missing = [n for n in (a, b) if n and n in evidence.unavailable]
            if missing:
                out.append(
                    Comparison(label, NOT_EVALUATED, "; ".join(f"{n}: {evidence.unavailable[n]}" for n in missing))
                )
                continue
            out.append(Comparison(label, measure_of(a, b)))
    return out


def _differences(evidence: Evidence) -> Callable:
    def measure(a: str, b: str | None) -> Difference:
        x = evidence.cells[a]
        y = np.zeros_like(x) if b is None else evidence.cells[b]
        return paired_difference(x, y, evidence.documents, paired_seeds=b is None)

    return measure


def judge(config: dict, evidence: dict[str, Evidence], smoke: bool = False) -> tuple[list[Verdict], list[Verdict]]:
    """(verdicts, sanity checks) of ``config`` (conf/paper.yaml) on ``evidence`` (measure -> Evidence)."""
    alpha = float(config.get("alpha", 0.05))
    out = {"verdicts": [], "sanity": []}
    for kind in out:
        for v in config.get(kind) or []:
            measure = v["measure"]
            verdict = Verdict(
                v["id"], v["claim"], measure, v["predict"], v.get("paper", ""), [], sanity=kind == "sanity"
            )
            if measure not in evidence:
                verdict.note = f"this group has no {measure} measurements"
            else:
                verdict.comparisons = comparisons(v["compare"], evidence[measure], _differences(evidence[measure]))
                tested = [c for c in verdict.comparisons if not c.note]
                if tested:
                    verdict.p = max(c.p(verdict.predict) for c in tested)
                verdict.note = "; ".join(f"{c.text}: {c.note}" for c in verdict.comparisons if c.note)
                if not tested or any(c.blocks for c in verdict.comparisons):
                    verdict.p = float("nan")  # a verdict is tested whole or not at all
            out[kind].append(verdict)
    _decide(out["verdicts"], alpha, smoke)
    _decide(out["sanity"], alpha, smoke, corrected=False)
    return out["verdicts"], out["sanity"]


def recheck(
    config: dict, judged: list[Verdict], evidence: dict[str, Evidence]
) -> list[tuple[Verdict, list[Comparison]]]:
    """The judged verdicts whose measure is in ``evidence``, their comparisons again on that evidence (e.g. fewer
    tokens), each interval at the level its verdict was judged at: a descriptive robustness check, not a test."""
    specs = {v["id"]: v for v in config.get("verdicts") or []}
    out = []
    for v in judged:
        if v.measure not in evidence or not np.isfinite(v.level) or v.id not in specs:
            continue
        ev = evidence[v.measure]
        found = comparisons(specs[v.id]["compare"], ev, _differences(ev))
        out.append((v, [c if c.note else Comparison(c.text, c.difference.at(v.level)) for c in found]))
    return out


def on_predicted_side(difference: Difference, predict: str) -> bool:
    """Whether the whole interval lies on the side ``predict`` ("<0" or ">0") names."""
    return difference.high < 0 if predict == "<0" else difference.low > 0


def _decide(verdicts: list[Verdict], alpha: float, smoke: bool, corrected: bool = True) -> None:
    tested = [v for v in verdicts if np.isfinite(v.p)]
    adjusted = holm([v.p for v in tested]) if corrected else [v.p for v in tested]
    order = np.argsort([v.p for v in tested], kind="stable")
    for rank, i in enumerate(order):  # Holm tests the i-th smallest p at alpha / (m - rank)
        v = tested[i]
        v.p_adjusted = adjusted[i]
        step = alpha / (len(tested) - rank) if corrected else alpha
        v.level = 1 - 2 * step
        v.status = REPRODUCED if v.p_adjusted <= alpha else INCONCLUSIVE
    rest = [v for v in tested if v.status != REPRODUCED]
    contra = [
        min(
            1.0, len(v.comparisons) * min(c.p(">0" if v.predict == "<0" else "<0") for c in v.comparisons if not c.note)
        )
        for v in rest
    ]
    for v, p in zip(rest, holm(contra) if corrected else contra):
        if p <= alpha:
            v.status = CONTRADICTED
    for v in tested:
        v.comparisons = [
            Comparison(c.text, c.difference.at(v.level), c.note) if not c.note else c for c in v.comparisons
        ]
        if smoke:
            v.status = SMOKE
