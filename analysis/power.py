"""What a verdict could detect: the smallest true difference that its test, as it is run, finds with a given
power, for the seeds and units it had, or for a proposed number of seeds from the measured variance components.

As it is run: the project's own test (``stats.paired_difference``, its estimated Welch-Satterthwaite degrees of
freedom, its one-sided p at the verdict's Holm level), simulated, not a noncentral t at the planned df. The
estimated df varies from study to study (at 2-3 seeds its 10th percentile is 1.5-4), and a study whose df falls
low has a wide interval: a noncentral t at the planned df overstates power (simulated: 59-67% where 80%
was stated). So: simulate the test at the null ``reps`` times (``coverage.Simulator``: cells with the measured
seed, file and token-noise components on the layout of the scored tokens), keep each draw's estimate e_r,
standard error se_r and df_r. A true difference delta in the predicted direction is found in draw r exactly when
delta >= e_r + t_{1-alpha, df_r} se_r (the estimate moves by delta, se and df do not), so the power at delta is
the share of draws whose threshold lies below it, and the detectable effect is the ``power`` quantile of the
thresholds: no root finding, and the same draws serve every alpha.

A verdict of k comparisons needs every one: each is given power 1 - (1 - power) / k, so that all k are found
with at least ``power`` (Bonferroni), and the verdict's detectable effect is the largest of theirs. ``alpha`` is
the level the verdict is tested at (its Holm step; the first step, alpha / (2 m), is the strictest).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats as scipy_stats

from posenc_lab.cellnames import CellName

from .coverage import TOKENS_PER_PSEUDO, Components, Layout, Simulator
from .stats import paired_difference
from .verdicts import Evidence, judge

POWER = 0.8
REPS = 1000  # simulated studies a statement rests on: its power is within about +-0.013 (one SE) of the stated
PSEUDO = 1024  # pseudo-tokens a simulated study is drawn with (the estimator reads only unit sums: see _coarse)


def _check(alpha: float, power: float) -> None:
    if not (0 < alpha < 0.5 and 0.5 <= power < 1):
        raise ValueError(f"alpha must be in (0, 0.5) and power in [0.5, 1), got {alpha} and {power}")


@dataclass(frozen=True)
class NullDraws:
    """The test run ``reps`` times at the null: estimate, se and df of each draw, and the true SD of the estimate
    (over the draws)."""

    estimate: np.ndarray
    se: np.ndarray
    df: np.ndarray

    @property
    def sd(self) -> float:
        return float(np.sqrt(np.mean(self.estimate**2)))  # the null's mean is 0

    def detectable(self, alpha: float, power: float = POWER) -> float:
        """The true difference the test at one-sided ``alpha`` finds with probability ``power`` (module docstring),
        in the unit of the draws."""
        _check(alpha, power)
        threshold = self.estimate + scipy_stats.t.ppf(1 - alpha, self.df) * self.se
        return float(np.quantile(threshold, power))

    def power(self, delta: float, alpha: float) -> float:
        """The share of draws in which the test at one-sided ``alpha`` finds a true difference ``delta``."""
        return float(np.mean(self.estimate + scipy_stats.t.ppf(1 - alpha, self.df) * self.se <= delta))


def _coarse(layout: Layout, comps: Components) -> tuple[Layout, Components]:
    """The same study drawn with about ``PSEUDO`` pseudo-tokens: every file's tokens divided by q and the token
    noise law kappa n^-gamma by q^-gamma, so that each file mean has the noise of its real tokens and each unit
    its share of the tokens (the estimator reads tokens only through their sums per unit and seed)."""
    q = max(1.0, sum(layout.file_tokens) / TOKENS_PER_PSEUDO / PSEUDO)
    tokens = tuple(max(1, round(n / q)) for n in layout.file_tokens)
    return Layout(layout.name, tokens, layout.file_family), replace(comps, kappa=comps.kappa * q**-comps.gamma)


def null_draws(
    layout: Layout,
    comps: Components,
    n_a: int,
    n_b: int,
    alpha: float,
    reps: int = REPS,
    seed: int = 0,
    pooled_df: int = 0,
) -> NullDraws:
    """The test of two cells with ``n_a`` and ``n_b`` seeds (``n_b`` 0: one cell against zero, its seeds paired
    as the verdicts pair them), simulated at the null on ``layout`` with the components ``comps`` (every cell the
    default seed SD), at the interval level 1 - 2 alpha of the one-sided test. ``pooled_df`` > 0: the seed
    variance pooled over cells (``pooling``) on that many df, drawn as the true variance of a seed's mean times
    chi2(df) / df, as the report runs it where its test pooled."""
    _check(alpha, POWER)
    coarse, comps = _coarse(layout, comps)
    sim, rng = Simulator(coarse, comps), np.random.default_rng(seed)
    if pooled_df:  # the true variance of one seed's mean under these components (256 seeds: within about 9%)
        many = sim.cell(rng, "", 256)
        sigma2 = float(np.var(many.mean(1), ddof=1))
    est, se, df = np.empty(reps), np.empty(reps), np.empty(reps)
    for r in range(reps):
        a = sim.cell(rng, "", n_a)
        b = sim.cell(rng, "", n_b) if n_b else np.zeros_like(a)
        pooled = (sigma2 * rng.chisquare(pooled_df) / pooled_df, pooled_df) if pooled_df else None
        d = paired_difference(a, b, sim.family, 1 - 2 * alpha, paired_seeds=not n_b, seed_var=pooled)
        est[r], se[r], df[r] = d.estimate, d.se, d.df
    return NullDraws(est, se, df)


def planned(layout: Layout, comps: Components, n_seeds: int, alpha: float, power: float = POWER, **kw) -> dict:
    """The detectable difference of two cells with ``n_seeds`` each on a layout (files with their tokens and
    families) at measured components (``variance.py``), for the test as it is run. Returns the estimate's true
    SD (se), the median estimated df, and the detectable effect (nats)."""
    if n_seeds < 2:
        raise ValueError(f"a planned comparison needs at least 2 seeds a cell (one seed has no spread), got {n_seeds}")
    draws = null_draws(layout, comps, n_seeds, n_seeds, alpha, **kw)
    se, df = draws.sd, float(np.median(draws.df))
    return {"n_seeds": n_seeds, "se": se, "df": df, "detectable": draws.detectable(alpha, power), "draws": draws}


@functools.lru_cache(maxsize=32)
def _unit_draws(unit_tokens: tuple[int, ...], n_a: int, n_b: int, alpha: float, pooled_df: int = 0) -> NullDraws:
    from .coverage import MEASURED

    layout = Layout("units", unit_tokens, tuple(range(len(unit_tokens))))
    return null_draws(layout, MEASURED, n_a, n_b, alpha, pooled_df=pooled_df)


def verdict_detectable(
    differences: Sequence, paired: Sequence[bool], units, alpha: float, power=POWER, pooled_df: int = 0
) -> float:
    """The effect (the same in each comparison) a verdict of these comparisons (``paired``: a cell against zero)
    finds with ``power`` at one-sided ``alpha``, from the seeds and units it had: each comparison's test simulated
    on its units (``units`` [tokens], each token's unit) at the measured components' shape, scaled to the
    comparison's own standard error (the estimated se stands in for the true SD); ``pooled_df``: the seed variance
    pooled on that many df, as the report ran it (0: each cell's own)."""
    _check(alpha, power)
    if not differences:
        return float("nan")
    each = 1 - (1 - power) / len(differences)
    tokens = tuple(int(n) for n in np.unique(np.asarray(units), return_counts=True)[1])
    out = []
    for d, alone in zip(differences, paired):
        draws = _unit_draws(tokens, d.n_a, 0 if alone else d.n_b, alpha, pooled_df)
        out.append(d.se * draws.detectable(alpha, each) / draws.sd)
    return max(out)


def verdict_power(
    differences: Sequence, paired: Sequence[bool], bounds: Sequence[float], units, alpha: float, pooled_df: int = 0
) -> float:
    """The chance that the verdict's test finds every comparison were each true difference the size measured
    (|estimate - bound|, each in its predicted direction): each comparison's power from the draws of
    ``verdict_detectable``, the verdict's the Bonferroni bound 1 - sum (1 - p_i). What a reader needs where the
    power curve is flat: the 80% point can lie far past every effect in sight while the power at the measured one
    is, say, 0.6."""
    if not differences:
        return float("nan")
    tokens = tuple(int(n) for n in np.unique(np.asarray(units), return_counts=True)[1])
    miss = 0.0
    for d, alone, bound in zip(differences, paired, bounds):
        draws = _unit_draws(tokens, d.n_a, 0 if alone else d.n_b, alpha, pooled_df)
        size = abs(d.estimate - bound) / d.se * draws.sd if d.se > 0 else float("inf")
        miss += 1 - draws.power(size, alpha)
    return max(0.0, 1 - miss)


def judged(config: dict, cells: Mapping[CellName, int], measures: Mapping[str, Callable[[CellName], bool]]) -> list:
    """The ids of the verdicts of ``config`` (conf/paper.yaml) that the report will judge, i.e. put in Holm's
    family, on a grid of ``cells`` (cell -> its seeds), each measure holding the cells it is given for:
    ``verdicts.judge`` itself, run on stand-in values (a verdict whose cells are absent or have one seed is left
    out exactly as the report leaves it out)."""
    rng, units = np.random.default_rng(0), np.repeat(np.arange(4), 4)
    evidence = {}
    for measure, holds in measures.items():
        keys = {str(c): c for c in cells if holds(c)}
        values = {n: rng.normal(size=(cells[c], len(units))) for n, c in keys.items()}
        evidence[measure] = Evidence(values, keys, units)
    verdicts, _ = judge(config, evidence)
    return [v.id for v in verdicts if np.isfinite(v.p)]


def plan_lines(
    file_tokens: Sequence[int], file_family: Sequence[int], seeds: Sequence[int], n_verdicts: int, alpha, comps
):
    """What ``posenc-lab ablate --plan`` says a study can detect: for each number of seeds a cell, the smallest
    difference of two cells that a verdict tested at Holm's first step (alpha / (2 m), m the verdicts the report
    will judge: the strictest) finds with 80% power, the test simulated as it is run (module docstring) at the
    measured components ``comps`` (``coverage.MEASURED``) on the layout the report will score (files with their
    scored tokens and families: ``dumps.scored_files``). A projection: a verdict whose cells spread more than the
    measured default, or whose pairs differ more from file to file, detects less (the report states each)."""
    tokens, family = np.asarray(file_tokens), np.asarray(file_family)
    _, per_family = np.unique(family, return_inverse=True)
    by_family = np.bincount(per_family, weights=tokens)
    share = by_family.max() / by_family.sum()
    level = alpha / (2 * max(1, n_verdicts))
    layout = Layout("planned", tuple(int(t) for t in tokens), tuple(int(f) for f in per_family))
    out = [
        f"# power: {len(by_family)} families in the scored tokens (the largest {share:.1%}), {n_verdicts} verdicts "
        f"the report will judge ({2 * n_verdicts} hypotheses; Holm's first step: one-sided alpha {level:.2g}); the "
        f"test as run (estimated df), simulated {REPS} times at the measured components: seed SD "
        f"{comps.default_seed_sd} nats, cell-by-file SD {comps.file_sd} nats, intra-family correlation {comps.icc}"
    ]
    for n in seeds:
        if n < 2:
            out.append(f"#   {n} seed a cell: no verdict is judged (one seed has no spread)")
            continue
        p = planned(layout, comps, n, level)
        out.append(
            f"#   {n} seeds a cell: detects a difference of {p['detectable']:.4f} nats with {POWER:.0%} power "
            f"(median df {p['df']:.1f})"
        )
    return out


def task_null_draws(
    instances: int, n_seeds: int, alpha: float, seed_sd: float, p: float = 0.5, reps: int = REPS, seed: int = 0
) -> NullDraws:
    """The test of a length-generalization verdict (``lengthgen.judge``: exact match of two cells on the same
    ``instances`` test instances, each with ``n_seeds`` seeds, the instances the units) simulated at the null:
    each seed's accuracy p + N(0, seed_sd) (clipped to [0, 1]), each instance right with that probability. p = 0.5
    gives a 0/1 outcome its largest variance, so the statement holds at any accuracy."""
    _check(alpha, POWER)
    rng, units = np.random.default_rng(seed), np.arange(instances)
    est, se, df = np.empty(reps), np.empty(reps), np.empty(reps)
    for r in range(reps):
        acc = np.clip(p + rng.normal(0, seed_sd, (2, n_seeds, 1)), 0, 1)  # [cell, seed, 1]
        hits = (rng.random((2, n_seeds, instances)) < acc).astype(np.float64)
        d = paired_difference(hits[0], hits[1], units, 1 - 2 * alpha)
        est[r], se[r], df[r] = d.estimate, d.se, d.df
    return NullDraws(est, se, df)


def task_plan_lines(
    n_claims: int, seeds: Sequence[int], instances: int, alpha: float, seed_sd: float, claims_file: str
) -> list[str]:
    """What ``posenc-lab ablate --plan`` says a task grid can detect: for each number of seeds a cell, the smallest
    difference in exact match per instance (``task_null_draws``) that a task verdict tested at Holm's first step
    (alpha / (2 m), m the claims the report will judge) finds with 80% power, at a seed SD ``seed_sd`` (the file of
    conf/ ``claims_file``'s). A claim per answer token (``metric: token``) has less spread per instance: the statement
    bounds it from above."""
    level = alpha / (2 * max(1, n_claims))
    out = [
        f"# power (task verdicts): {n_claims} claim(s) the report will judge ({2 * n_claims} hypotheses; Holm's "
        f"first step: one-sided alpha {level:.2g}); exact match per instance of two cells on the same {instances} "
        f"test instances, simulated {REPS} times at the null at accuracy 0.5 (the largest 0/1 variance) with a "
        f"seed SD of {seed_sd} (conf/{claims_file}'s plan_seed_sd); a claim per answer token detects less "
        f"than this at most"
    ]
    for n in seeds:
        if n < 2:
            out.append(f"#   {n} seed a cell: no task verdict is judged (one seed has no spread)")
            continue
        draws = task_null_draws(instances, n, level, seed_sd)
        delta, df = draws.detectable(level), np.median(draws.df)
        if delta >= 1:  # an accuracy moves at most 1: the interval over seeds (df about seeds - 1) is too wide
            out.append(
                f"#   {n} seeds a cell: detects no difference in exact match with {POWER:.0%} power (it would take "
                f"{delta:.2f}, more than an accuracy can move; median df {df:.1f}): a claim needs more seeds"
            )
            continue
        out.append(
            f"#   {n} seeds a cell: detects a difference of {delta:.3f} in exact match ({delta * 100:.0f} points) "
            f"with {POWER:.0%} power (median df {df:.1f})"
        )
    return out
