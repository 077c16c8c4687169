"""One seed variance for the cells of a measure, where the data support it (Bartlett's test of equal variances).

Why. With 2 seeds a cell, each cell's seed part of ``stats.paired_difference`` has 1 degree of freedom; where it
holds most of the variance the interval's df is capped at 1 (``stats._df``), a one-sided t of about 100 at Holm's
first steps, so the power of a verdict levels off near 0.7 whatever the effect (simulated at the measured
components: 0.06 to 0.3 nats alike). If the cells share one seed SD, the variances of their seed means estimate
one number, and pooled they carry sum (n_c - 1) degrees of freedom: 6 cells of 2-3 seeds give 9-12 where each
alone gives 1-2.

What. For the cells of one measure with at least 2 seeds (``Evidence.cells``: [n_seeds, tokens]), each seed's mean
over the tokens m_cs; the pooled variance of one seed's mean s^2 = sum_c sum_s (m_cs - m_c)^2 / sum_c (n_c - 1),
df = sum_c (n_c - 1). Bartlett's test of equal variances on the m_cs (scipy; normal seed means: the mean of
thousands of tokens) decides: p > ``alpha`` pools, else each cell keeps its own (and the report says which and
why). Not Levene's: with 2 seeds both absolute deviations from a cell's median are equal, so its within-cell
spread is 0 and the test degenerates. Failing to reject is not proof of equality: with 2-3 seeds the test
detects only a large difference (it refused in 90% or more of studies at a ratio of SDs of 25, 3 seeds a cell);
the pooled interval is then
as wrong as the SDs are unequal, which ``tests/analysis/test_pooling.py`` measures (coverage at equal SDs, the test
refusing at clearly unequal ones, and undercoverage at the unequal SDs it cannot see). A cell whose seeds are all
equal (a variance of 0) is left out of the test and the pool: Bartlett's statistic needs every variance above 0.

Off by default (conf/paper.yaml ``seed_variance.pool: false``; the test is still run and reported). At the seed
SDs measured on the default ablation (0 to 0.0075 nats, 2-3 seeds a cell; ``coverage.MEASURED``) the test rarely
sees their differences, pools, and gives the noisiest cell the average SD: the whole pipeline at the global null
(``coverage.error_rates``, 150 simulated ablations each) made a false claim in 11% of ablations pooling at a test
level of 0.05 and 9% at 0.25, against 6% with each cell's own. Pooling buys power only where seed SDs are truly
equal; a preset with more seeds a cell, where the test can see a difference, may turn it on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as scipy_stats


@dataclass(frozen=True)
class SeedPooling:
    """The test and its decision for one measure: ``variance`` (of one seed's mean) and ``df`` where ``pooled``."""

    measure: str
    cells: tuple[str, ...]  # the cells the test read (>= 2 seeds, a seed variance above 0)
    statistic: float
    p: float
    alpha: float
    variance: float
    df: int
    sds: dict[str, float]  # each cell's own SD of its seed means
    applied: bool = True  # conf/paper.yaml's seed_variance.pool: False reports the test and pools nothing

    @property
    def pooled(self) -> bool:
        """The test does not reject one seed SD (and there are 2 cells to pool)."""
        return bool(len(self.cells) >= 2 and self.p > self.alpha)

    @property
    def seed_var(self) -> tuple[float, float] | None:
        """(s^2, df) for ``stats.paired_difference``, or None where each cell keeps its own."""
        return (self.variance, float(self.df)) if self.pooled and self.applied else None

    def text(self, scale: float = 1.0, unit: str = "nats") -> str:
        sds = ", ".join(f"{c} {sd * scale:.3g}" for c, sd in self.sds.items())
        if len(self.cells) < 2:
            return f"`{self.measure}`: fewer than 2 cells with a seed spread; each cell keeps its own seed variance"
        test = f"Bartlett's test of equal seed variances over {len(self.cells)} cells: statistic {self.statistic:.2f}, "
        test += f"p {self.p:.2g}"
        if self.pooled:
            pooled = f"one seed SD, {np.sqrt(self.variance) * scale:.3g} {unit} a seed mean on {self.df} df"
            use = "pooled" if self.applied else "not pooled (seed_variance.pool is false: each cell keeps its own)"
            return f"`{self.measure}`: {test} > {self.alpha:g}: {pooled}, {use} (each cell's: {sds})"
        return f"`{self.measure}`: {test} <= {self.alpha:g}: the seed SDs differ ({sds}); each cell keeps its own"


def seed_pooling(measure: str, evidence: Any, alpha: float, applied: bool = True) -> SeedPooling:
    """Bartlett's test on the seed means of ``evidence``'s cells (a ``verdicts.Evidence``, read for its ``cells``) and
    the pooled seed variance (module docstring)."""
    if not 0 < alpha < 1:
        raise ValueError(f"seed_variance.test_alpha must be in (0, 1), e.g. 0.05, got {alpha!r}")
    means = {
        c: np.asarray(x, np.float64).mean(1)
        for c, x in evidence.cells.items()
        if np.ndim(x) == 2 and len(x) >= 2 and np.isfinite(x).all()
    }
    means = {c: m for c, m in means.items() if np.var(m) > 0}
    sds = {c: float(np.std(m, ddof=1)) for c, m in means.items()}
    if len(means) < 2:
        return SeedPooling(measure, tuple(means), float("nan"), float("nan"), alpha, float("nan"), 0, sds, applied)
    statistic, p = scipy_stats.bartlett(*means.values())
    ss = sum(float(((m - m.mean()) ** 2).sum()) for m in means.values())
    df = sum(len(m) - 1 for m in means.values())
    return SeedPooling(measure, tuple(means), float(statistic), float(p), alpha, ss / df, df, sds, applied)
