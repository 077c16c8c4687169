"""The preregistered verdicts of ``conf/paper.yaml``, judged on the test split with Holm's correction.

Every verdict predicts the sign of one or more comparisons ``a - b`` of cells (or of ``a`` against zero; a
comparison may carry its own prediction and bound, e.g. "above -0.01": does not gain more than 1%). A
comparison is ``stats.paired_difference`` of the cells' per-token values on the same tokens, with seeds and
the text's independent units (families, or documents) as the units. A verdict of several comparisons is
reproduced only if each is (intersection-union: its one-sided p-value is the largest of theirs), and
contradicted if any one is the other way (the smallest opposite p-value times the number of comparisons).

What is controlled. Every verdict is two one-sided hypotheses, "reproduced" and "contradicted", and Holm's
step-down procedure runs over all of them at once (2 m hypotheses for m verdicts) at ``alpha``: the chance of
any false claim, reproduced or contradicted, in any verdict, is at most alpha whatever the dependence between
verdicts. (Judging each direction at alpha, as before, lets the two add up to 2 alpha.) The rest are
"inconclusive". A verdict is not judged when a cell it needs has one seed ("not judged: one seed": there is no
seed spread to test against), when a cell was not trained ("not tested"), when a cell it names cannot be
measured (``Evidence.unavailable``: "not tested", with its reason: a verdict is never judged on fewer cells than
its claim names), or when a comparison holds a non-finite value ("not tested", the comparison "not evaluated"
with a note); such verdicts are left out of Holm's family, and the result does not depend on the order of the
cells.

The intervals. Each verdict's intervals are shown at the level of the Holm step that decided its reproduced
hypothesis (two-sided 1 - 2 alpha_i), or, for a verdict Holm did not reach, of the step where it stopped: so a
verdict is reproduced exactly when every one of its intervals lies on its predicted side. (Shown at the level
of its own rank instead, an interval of a verdict Holm never reached can lie on the predicted side while the
verdict is inconclusive: ``tests/analysis/test_verdicts.py`` has the case.)

Controls (``controls`` of conf/paper.yaml) are results that hold by construction of the run (a model without
memory cannot recall past its segment; global positions past the training episodes were never seen): computed
alike, each direction at alpha with no correction, out of Holm's family, and read the other way round. A control
that holds says the run works; one that does not ("failed: a defect of the run") says the run is broken (too few
steps, a bug), never that the paper is contradicted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import yaml

from posenc_lab import config_dir
from posenc_lab.cellnames import CellName, CellPattern

from .pooling import SeedPooling, seed_pooling
from .stats import NOT_EVALUATED, Difference, holm, paired_difference

REPRODUCED, CONTRADICTED, INCONCLUSIVE, NOT_TESTED = "reproduced", "contradicted", "inconclusive", "not tested"
HOLDS, DEFECT = "holds", "failed: a defect of the run"  # what a control reads (module docstring)
ONE_SEED = "not judged: one seed"
SMOKE = "not judged (smoke run)"
OPPOSITE = {"<0": ">0", ">0": "<0"}


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
    """One comparison of a verdict; ``predict``, ``bound``: what it predicts ("<0" or ">0": the difference
    below or above ``bound``; "" takes the verdict's prediction, at 0)."""

    text: str
    difference: Difference
    note: str = ""  # why it was not tested
    blocks: bool = False  # a cell it names was not trained (or is ambiguous): the verdict cannot be tested
    predict: str = ""
    bound: float = 0.0

    def p(self, predict: str) -> float:
        """One-sided p that the difference is not on the ``predict`` side of its bound; NaN if not evaluated."""
        return self.difference.p_value(predict, self.bound) if np.isfinite(self.difference.estimate) else float("nan")


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
    control: bool = False  # a result true by construction (module docstring): out of Holm's family
    note: str = ""
    p_contra: float = float("nan")  # one-sided p of "contradicted" (any one comparison the other way)
    p_contra_adjusted: float = float("nan")
    expands: str = ""  # what each wildcard of the verdict stood for, and what it left out
    pooling: SeedPooling | None = None  # the seed variance of its measure: pooled, or each cell's own (and why)


def _expand(side: str, keys: dict[str, CellName], exclude: str | None) -> list[str]:
    """Cell names matching one side of a comparison (a pattern of ``cellnames``: ``xl:mem``, ``absolute:mem``,
    ``*``), but ``exclude``."""
    pattern = CellPattern.parse(side, "conf/paper.yaml")
    return [n for n, k in keys.items() if n != exclude and pattern.matches(k)]


def _is_wildcard(side: str) -> bool:
    return side.startswith(("*", "absolute"))


def _items(spec: list) -> list[tuple[str, str, float]]:
    """(text, predict, bound) of each entry of a ``compare`` list: a string, or {compare, predict, bound}."""
    out = []
    for item in spec:
        if isinstance(item, dict):
            predict = str(item.get("predict", ""))
            if predict not in ("", "<0", ">0"):
                raise ValueError(f"conf/paper.yaml: predict of {item.get('compare')!r} must be '<0' or '>0'")
            out.append((str(item["compare"]), predict, float(item.get("bound", 0.0))))
        else:
            out.append((str(item), "", 0.0))
    return out


def _named(items: list[tuple[str, str, float]], evidence: Evidence) -> set[str]:
    """The cells a verdict names explicitly on the left of its comparisons (a wildcard alone leaves them out)."""
    lefts = (text.partition(" - ")[0].strip() for text, _, _ in items)
    return {n for a in lefts if not _is_wildcard(a) for n in _expand(a, evidence.keys, None)}


def comparisons(spec: list, evidence: Evidence, measure_of: Callable) -> list[Comparison]:
    """Every comparison a verdict's ``compare`` list names, each with its Difference (or why not). A wildcard
    alone (``*:mem``) is every cell it matches but those the verdict names explicitly, each against zero."""
    items = _items(spec)
    named = _named(items, evidence)
    out = []
    for text, predict, bound in items:
        a_text, _, b_text = (t.strip() for t in text.partition(" - "))
        a_names = _expand(a_text, evidence.keys, None)
        if _is_wildcard(a_text) and not b_text:
            pairs = [(a, None) for a in a_names if a not in named]
        elif len(a_names) != 1:
            why = "no such cell was trained" if not a_names else f"several cells match: {', '.join(a_names)}"
            out.append(Comparison(text, NOT_EVALUATED, why, blocks=True, predict=predict, bound=bound))
            continue
        else:
            pairs = [(a_names[0], b) for b in (_expand(b_text, evidence.keys, a_names[0]) if b_text else [None])]
        if not pairs:
            out.append(Comparison(text, NOT_EVALUATED, "no such cell was trained", True, predict, bound))
        for a, b in pairs:
            label = f"{a} - {b}" if b else a
            missing = [n for n in (a, b) if n and n in evidence.unavailable]
            if missing:
                why = "; ".join(f"{n}: {evidence.unavailable[n]}" for n in missing)
                out.append(Comparison(label, NOT_EVALUATED, why, True, predict, bound))
                continue
            bad = [n for n in (a, b) if n and not np.isfinite(evidence.cells[n]).all()]
            if bad:  # a numerical failure, not a design choice: the verdict cannot be judged whole
                why = f"not evaluated: a non-finite value in {' and '.join(bad)}"
                out.append(Comparison(label, NOT_EVALUATED, why, True, predict, bound))
                continue
            out.append(Comparison(label, measure_of(a, b), predict=predict, bound=bound))
    return out


def expansions(spec: list, evidence: Evidence) -> str:
    """What each wildcard of a verdict stood for, and which cells of the group it left out (another training
    loss, another memory setting): "`*` = shaw:mem32, sinusoid:mem32; left out: sinusoid:mem32:half"."""
    parts, named = [], _named(_items(spec), evidence)
    for text, _, _ in _items(spec):
        a_text, _, b_text = (t.strip() for t in text.partition(" - "))
        for is_b, side in ((False, a_text), (True, b_text)):
            if not side or not _is_wildcard(side):
                continue
            a_names = _expand(a_text, evidence.keys, None) if is_b else list(named)
            matched = _expand(side, evidence.keys, a_names[0] if len(a_names) == 1 else None)
            matched = [n for n in matched if is_b or n not in named]
            others = [n for n, k in evidence.keys.items() if k.group == "" and n not in matched and n not in a_names]
            parts.append(
                f"`{side}` = {', '.join(matched) or 'no cell'}" + (f"; left out: {', '.join(others)}" if others else "")
            )
    return "; ".join(parts)


def _differences(evidence: Evidence, level: float, pooling: SeedPooling | None = None) -> Callable:
    """The comparisons' Differences, at ``level`` until Holm sets each verdict's own (``Difference.at``), with the
    measure's pooled seed variance where its test pooled (``pooling``)."""
    seed_var = pooling.seed_var if pooling is not None else None

    def measure(a: str, b: str | None) -> Difference:
        x = evidence.cells[a]
        y = np.zeros_like(x) if b is None else evidence.cells[b]
        return paired_difference(x, y, evidence.documents, level, paired_seeds=b is None, seed_var=seed_var)

    return measure


def poolings(config: dict, evidence: dict[str, Evidence]) -> dict[str, SeedPooling]:
    """measure -> its seed-variance test (``pooling.seed_pooling``) where conf/paper.yaml has a ``seed_variance``
    block: reported always, applied only where its ``pool`` is true (fixed in advance, as the verdicts)."""
    spec = config.get("seed_variance")
    if not spec:
        return {}
    alpha, applied = float(spec.get("test_alpha", 0.05)), bool(spec.get("pool", False))
    return {m: seed_pooling(m, ev, alpha, applied) for m, ev in evidence.items()}


def _predict(c: Comparison, verdict_predict: str) -> str:
    return c.predict or verdict_predict


def _p_values(v: Verdict) -> tuple[float, float]:
    """(reproduced, contradicted) one-sided p of a verdict whose comparisons were all evaluated: the largest
    p of its comparisons (every one must hold), and k times the smallest opposite p (any one contradicts)."""
    tested = [c for c in v.comparisons if not c.note]
    p = [c.p(_predict(c, v.predict)) for c in tested]
    opposite = [c.p(OPPOSITE[_predict(c, v.predict)]) for c in tested]
    return float(max(p)), float(min(1.0, len(tested) * min(opposite)))


def judge(config: dict, evidence: dict[str, Evidence], smoke: bool = False) -> tuple[list[Verdict], list[Verdict]]:
    """(verdicts, controls) of ``config`` (conf/paper.yaml) on ``evidence`` (measure -> Evidence): the claims,
    Holm-corrected together, and the controls, each uncorrected, a failure read as a defect of the run."""
    if "sanity" in config:
        raise ValueError("conf/paper.yaml: `sanity` is now `controls` (results true by construction); rename the key")
    alpha = float(config.get("alpha", 0.05))
    level = 1 - 2 * alpha  # each direction at alpha, before Holm
    pooled = poolings(config, evidence)
    out = {"verdicts": [], "controls": []}
    for kind in out:
        for v in config.get(kind) or []:
            measure = v["measure"]
            verdict = Verdict(
                v["id"], v["claim"], measure, v["predict"], v.get("paper", ""), [], control=kind == "controls"
            )
            if measure not in evidence:
                verdict.note = f"this group has no {measure} measurements"
                out[kind].append(verdict)
                continue
            verdict.pooling = pooled.get(measure)
            differences = _differences(evidence[measure], level, verdict.pooling)
            verdict.comparisons = comparisons(v["compare"], evidence[measure], differences)
            verdict.expands = expansions(v["compare"], evidence[measure])
            tested = [c for c in verdict.comparisons if not c.note]
            verdict.note = "; ".join(f"{c.text}: {c.note}" for c in verdict.comparisons if c.note)
            if not tested or any(c.blocks for c in verdict.comparisons):
                pass  # a verdict is tested whole or not at all: not tested, p NaN
            elif any(not c.difference.covers_seeds for c in tested):
                one = sorted({c.text for c in tested if not c.difference.covers_seeds})
                verdict.status = ONE_SEED
                verdict.note = "; ".join(
                    x for x in (verdict.note, f"a cell has one seed ({', '.join(one)}): descriptive only") if x
                )
            else:
                verdict.p, verdict.p_contra = _p_values(verdict)
            out[kind].append(verdict)
    _decide(out["verdicts"], alpha, smoke)
    _decide(out["controls"], alpha, smoke, corrected=False)
    for c in out["controls"]:
        _as_control(c, alpha)
    return out["verdicts"], out["controls"]


def _as_control(c: Verdict, alpha: float) -> None:
    """A judged control's status: it holds, or its failure is a defect of the run (saying which way it failed)."""
    if c.status == REPRODUCED:
        c.status = HOLDS
    elif c.status in (CONTRADICTED, INCONCLUSIVE):
        why = (
            f"the opposite side holds at one-sided {alpha:g}"
            if c.status == CONTRADICTED
            else f"not shown at one-sided {alpha:g}: the run did not produce what it is built to"
        )
        c.status, c.note = DEFECT, "; ".join(x for x in (c.note, why) if x)


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
        found = comparisons(specs[v.id]["compare"], ev, _differences(ev, v.level, v.pooling))
        out.append((v, [c if c.note else replace(c, difference=c.difference.at(v.level)) for c in found]))
    return out


def on_predicted_side(difference: Difference, predict: str, bound: float = 0.0) -> bool:
    """Whether the whole interval lies on the side of ``bound`` that ``predict`` ("<0" or ">0") names (an
    interval within float32 rounding of zero lies on neither)."""
    if bound == 0.0 and difference.identical:
        return False
    return difference.high < bound if predict == "<0" else difference.low > bound


def holm_steps(p: list[float], alpha: float, corrected: bool) -> tuple[list[float], list[float]]:
    """(adjusted p, level threshold) of each hypothesis: the Holm step that rejected it, or, for one Holm did
    not reject, the step where it stopped (uncorrected: alpha for all)."""
    if not corrected:
        return list(p), [alpha] * len(p)
    adjusted, order = holm(p), np.argsort(p, kind="stable")
    m, step = len(p), [float("nan")] * len(p)
    stop = alpha / max(1, m)
    for rank, i in enumerate(order):
        if p[i] > alpha / (m - rank):
            stop = alpha / (m - rank)
            break
        step[i] = alpha / (m - rank)
    else:
        stop = alpha
    return adjusted, [s if np.isfinite(s) else stop for s in step]


def _decide(verdicts: list[Verdict], alpha: float, smoke: bool, corrected: bool = True) -> None:
    """Holm over both hypotheses of every judged verdict at once (module docstring)."""
    tested = [v for v in verdicts if np.isfinite(v.p) and np.isfinite(v.p_contra)]
    n = len(tested)
    adjusted, steps = holm_steps([v.p for v in tested] + [v.p_contra for v in tested], alpha, corrected)
    for i, v in enumerate(tested):
        v.p_adjusted, v.p_contra_adjusted = adjusted[i], adjusted[n + i]
        v.level = 1 - 2 * steps[i]
        v.status = (
            REPRODUCED if v.p_adjusted <= alpha else CONTRADICTED if v.p_contra_adjusted <= alpha else INCONCLUSIVE
        )
        v.comparisons = [c if c.note else replace(c, difference=c.difference.at(v.level)) for c in v.comparisons]
        if smoke:
            v.status = SMOKE
    if smoke:
        for v in verdicts:
            if v.status == ONE_SEED:
                v.status = SMOKE
