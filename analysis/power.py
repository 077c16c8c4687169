"""What a verdict could detect: the smallest true difference that its test finds with a given power, from the
seeds and units it had, or for a proposed number of seeds from the measured variance components.

For a one-sided t test at level alpha with standard error se and df degrees of freedom, a true difference
delta (in the predicted direction) is found with probability about

    power = P(T_{df, delta/se} > t_{1-alpha, df})      T_{df, ncp}: the noncentral t (scipy.stats.nct)

solved for delta (with few degrees of freedom the usual shortcut (t_{1-alpha} + t_{power}) se is too small:
at 3 df and alpha 0.0036 it has power 0.72, not 0.8). A verdict of k comparisons needs every
one: each is given power 1 - (1 - power) / k, so that all k are found with at least ``power`` (Bonferroni),
and the verdict's detectable effect is the largest of theirs. ``alpha`` is the level the verdict is tested
at (its Holm step; the first step, alpha / (2 m), is the strictest).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats as scipy_stats
from scipy.optimize import brentq

from .stats import Difference, _bell_mccaffrey

POWER = 0.8


def detectable(se: float, df: float, alpha: float, power: float = POWER) -> float:
    """The true difference a one-sided test at ``alpha`` finds with probability ``power`` (module docstring)."""
    if not (0 < alpha < 0.5 and 0.5 <= power < 1):
        raise ValueError(f"alpha must be in (0, 0.5) and power in [0.5, 1), got {alpha} and {power}")
    if not (np.isfinite(se) and df > 0):
        return float("nan")
    critical = scipy_stats.t.ppf(1 - alpha, df)
    ncp = brentq(lambda d: scipy_stats.nct.sf(critical, df, d) - power, 0.0, 10 * critical + 50)
    return float(ncp * se)


def verdict_detectable(differences: Sequence[Difference], alpha: float, power: float = POWER) -> float:
    """The effect (the same in each comparison) a verdict of these comparisons detects with ``power``."""
    if not differences:
        return float("nan")
    each = 1 - (1 - power) / len(differences)
    return max(detectable(d.se, d.df, alpha, each) for d in differences)


def planned(
    seed_sd_of_means: float,
    file_sd: float,
    icc: float,
    file_tokens: Sequence[int],
    file_family: Sequence[int],
    n_seeds: int,
    alpha: float,
    power: float = POWER,
) -> dict:
    """The detectable difference of two cells with ``n_seeds`` each on a layout (files with their tokens and
    families) at measured components (``variance.py``: the SD of a cell's seed means, which holds one seed's
    token noise; the file SD of a difference and its intra-family correlation). Returns se, df, detectable."""
    if n_seeds < 2:
        raise ValueError(f"a planned comparison needs at least 2 seeds a cell (one seed has no spread), got {n_seeds}")
    n_k, fam = np.asarray(file_tokens, float), np.asarray(file_family)
    n_g = np.bincount(fam, weights=n_k)
    N = n_k.sum()
    # Var of the text part: sum_g w_g^2 (tau_f^2 + tau_u^2 sum_{k in g} (n_k / n_g)^2)
    within = np.bincount(fam, weights=n_k**2) / n_g**2
    v_text = float(np.sum((n_g / N) ** 2 * (icc * file_sd**2 + (1 - icc) * file_sd**2 * within)))
    v_seed = seed_sd_of_means**2 / n_seeds
    df_text = _bell_mccaffrey(n_g / N)
    V = 2 * v_seed + v_text
    df = V**2 / (2 * v_seed**2 / (n_seeds - 1) + (v_text**2 / df_text if v_text > 0 else 0.0))
    se = float(np.sqrt(V))
    return {"n_seeds": n_seeds, "se": se, "df": float(df), "detectable": detectable(se, df, alpha, power)}


def plan_lines(
    file_tokens: Sequence[int],
    file_family: Sequence[int],
    seeds: Sequence[int],
    n_verdicts: int,
    alpha: float,
    comps,
):
    """What ``posenc-lab ablate --plan`` says a study can detect: for each number of seeds a cell, the smallest
    difference of two cells that a verdict tested at Holm's first step (alpha / (2 m): the strictest) finds with
    80% power, at the measured components ``comps`` (``coverage.MEASURED``: the median SD of a cell's seed means,
    the file SD of the close pair and the intra-family correlation) on the layout the report will score (files
    with their scored tokens and families: ``dumps.scored_files``). A projection: a verdict whose cells spread
    more than the median, or whose pairs differ more from file to file, detects less (the report states each)."""
    tokens, family = np.asarray(file_tokens), np.asarray(file_family)
    _, per_family = np.unique(family, return_inverse=True)
    by_family = np.bincount(per_family, weights=tokens)
    share = by_family.max() / by_family.sum()
    level = alpha / (2 * max(1, n_verdicts))
    out = [
        f"# power: {len(by_family)} families in the scored tokens (the largest {share:.1%}), {n_verdicts} verdicts "
        f"(Holm's first step: one-sided alpha {level:.2g}); measured components: SD of a cell's seed means "
        f"{comps.seed_sd_of_means} nats, cell-by-file SD {comps.file_sd} nats, intra-family correlation {comps.icc}"
    ]
    for n in seeds:
        if n < 2:
            out.append(f"#   {n} seed a cell: no verdict is judged (one seed has no spread)")
            continue
        p = planned(comps.seed_sd_of_means, comps.file_sd, comps.icc, tokens, per_family, n, level)
        out.append(f"#   {n} seeds a cell: detects a difference of {p['detectable']:.4f} nats with 80% power")
    return out
