"""The one estimator of the report: a difference of mean per-token losses between two cells, with an
interval whose units are the training seed and the unit of the text (on ``pystdlib`` the family, a package
or files that share windows; on a corpus without families its documents or chunks).

Why these units. A claim about a scheme is a claim over training seeds (another seed, another model) and
over text (another text of the same kind). Tokens are not independent: neighbouring tokens share their
context, a document's tokens share its topic and style, and the files of one package share their code, so
that a model's advantage on one file of ``asyncio/`` says much about the next one. The unit of the text
is the largest group whose members can be correlated: the split's own unit (its family), within which
nothing is assumed independent. The seed is the unit of training.

The model. For cell a (runs equal but for their seed) with seeds s = 1..n_a and units g = 1..G
(n_g scored tokens each, N in all, w_g = n_g / N), write the per-seed unit sums A[s, g] = sum_{t in g} a[s, t]:

    A[s, g] = n_g (mu_a + alpha_s) + U_g + W_sg

alpha_s: the seed's effect (variance sigma_a^2); U_g: the unit's effect, shared by every seed of the cell
and paired with cell b's through the text; W_sg: what a seed does on a unit (token noise, seed-by-text
interaction). The estimate is theta = mean_s m_a[s] - mean_s m_b[s], m_a[s] = sum_g A[s, g] / N. Its
variance has three parts, estimated by moments (no resampling):

    V_seed_a = var_s(m_a) / n_a            seeds and their token noise    (df n_a - 1)
    V_text   = sum_g c_g r_g^2 / N^2       units (CR2), and the token noise once more
               r_g = D_g - theta n_g,  D_g = mean_s A[s,g] - mean_s B[s,g]
    V_noise  = what the token noise adds to V_text in expectation, from the seed-to-seed spread of each
               unit's sums, so that it is not counted twice
    V        = V_seed_a + V_seed_b + max(0, V_text - V_noise)

V_text is the CR2 cluster-robust variance (Bell and McCaffrey 2002; Pustejovsky and Tipton 2018) of a
token-weighted mean under the working model "every unit's mean effect has the same variance" (Var D_g
proportional to n_g^2): c_g = 1 / (1 - 2 w_g + sum_h w_h^2), which makes it unbiased under that model and is
G / (G - 1) when the units are equal. Its degrees of freedom are Bell and McCaffrey's under the same model
(``_bell_mccaffrey``): G - 1 for equal units, and about (sum w^2)^2 / sum w^4 when they are not, so a unit
that holds half of the tokens leaves the text part with one or two degrees of freedom and a wide interval,
as it should: one unit is one draw. The interval is theta +- t_{df} sqrt(V), df by Welch-Satterthwaite over
the three parts (seeds of a, of b: n - 1 each; the text: Bell-McCaffrey), capped at a part's own df when it
holds 60% or more of V (``_df``: where one part of few df dominates, the plugged-in df rises exactly when the
variance is underestimated); its ends are moved by the estimate's skewness, estimated from the text part's third
cumulant (Hall's transformation, ``_hall``: skewed unit effects otherwise leave the t interval wholly below
the truth far more often than above), and the one-sided p-values go through the same transformation, so that an
interval excludes 0 exactly when its p-value says so. With 3 seeds a side df is small and
the interval wide: that is what 3 seeds know. A cell with one seed has no seed variance to estimate: its
interval covers the text only (``covers_seeds`` is False, and no verdict is judged on it).

Assumptions: seeds are exchangeable and independent between cells. Seed s of every cell is trained with
``seed_everything(s)`` (the same initialisation where the parameters agree, the same data order), so they need
not be: on the default ablation's dumps the seed means of two cells correlate at -0.08 over seeds they share (14
pairs of schemes; xl with and without memory -0.63 on 3 seeds; ``variance.seed_correlation``), no pairing to
use, and the seeds are analysed as independent (a positive correlation, 0.75 in the barely trained quick preset,
makes the interval conservative; ``paired_seeds`` is for one run's own values only). Units are independent and
scored with the same tokens for every run (the paired design); every effect is additive on the loss scale; the
mean of a cell is token-weighted (a unit counts by its scored tokens). Coverage and the verdicts' error rates at
the variance components measured on the default ablation: analysis/README.md (``python -m
posenc_lab_analysis.coverage``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats as scipy_stats

# The resolution of a mean of float32 losses (nats): an interval inside +-EPS is "identical" (e.g. an
# absolute scheme given more memory it cannot tell apart), not a difference.
EPS = 1e-5


@dataclass(frozen=True)
class Difference:
    """mean(a) - mean(b) with its interval at ``level``; ``se``, ``df``: of the t interval. ``n_a``, ``n_b``:
    seeds; ``units``: G, the independent units of the text; ``largest_share``: the largest unit's share of
    the scored tokens. ``covers_seeds``: both cells had >= 2 seeds (else the text alone)."""

    estimate: float
    low: float
    high: float
    level: float
    se: float
    df: float
    n_a: int
    n_b: int
    units: int
    covers_seeds: bool
    largest_share: float = float("nan")
    skew: float = 0.0  # a, the estimated skewness of the estimate (its text part's): Hall's transformation, ``_hall``

    @property
    def documents(self) -> int:
        """The old name of ``units`` (callers that still pass documents as the units)."""
        return self.units

    def p_value(self, predicted: str, bound: float = 0.0) -> float:
        """One-sided p of the null "not in the predicted direction of ``bound``" (predicted "<0" or ">0":
        the difference below, or above, ``bound``)."""
        if predicted not in ("<0", ">0"):
            raise ValueError(f"predicted must be '<0' or '>0', got {predicted!r}")
        if not np.isfinite(self.estimate):
            return float("nan")
        if self.identical and bound == 0.0:  # rounding decides no sign
            return 1.0
        shifted = self.estimate - bound
        if self.se == 0:
            side = shifted < 0 if predicted == "<0" else shifted > 0
            return 0.0 if side and abs(shifted) > EPS else 1.0
        t = _hall(shifted / self.se, self.skew)
        return float(scipy_stats.t.cdf(t, self.df) if predicted == "<0" else scipy_stats.t.sf(t, self.df))

    def at(self, level: float) -> Difference:
        """The same estimate with its interval at another level (e.g. a Holm-adjusted one)."""
        low, high = _bounds(self.estimate, self.se, self.df, self.skew, level)
        return replace(self, low=low, high=high, level=level)

    def scaled(self, k: float) -> Difference:
        """In other units (nats -> bits: k = 1 / ln 2)."""
        low, high = sorted((self.low * k, self.high * k))
        skew = self.skew * float(np.sign(k))
        return replace(self, estimate=self.estimate * k, low=low, high=high, se=self.se * abs(k), skew=skew)

    def text(self, digits: int = 3, signed: bool = True) -> str:
        if not np.isfinite(self.estimate):
            return "n/a"
        f = f"{{:{'+' if signed else ''}.{digits}f}}"
        return f"{f.format(self.estimate)} [{f.format(self.low)}, {f.format(self.high)}]"

    @property
    def identical(self) -> bool:
        """Within float32 rounding of zero: no difference to speak of, in either direction."""
        return max(abs(self.low), abs(self.high)) < EPS


NOT_EVALUATED = Difference(float("nan"), float("nan"), float("nan"), float("nan"), float("nan"), 0.0, 0, 0, 0, False)


def p_floor(df: float) -> float:
    """The smallest p-value worth printing at ``df`` degrees of freedom: a t tail beyond 1e-3 with fewer than
    30 degrees of freedom (a handful of seed means and text units) rests on the normality of those few values,
    which no data here can check; 1e-4 with more."""
    return 1e-3 if not df >= 30 else 1e-4


def p_text(p: float, df: float) -> str:
    """A p-value to two significant digits, or a bound below ``p_floor(df)`` ("< 1e-3"); "n/a" if not finite."""
    if not np.isfinite(p):
        return "n/a"
    floor = p_floor(df)
    return f"< {floor:.0e}".replace("e-0", "e-") if p < floor else f"{p:.2g}"


def _as_seeds(x, name: str, n_tokens: int | None) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    x = x[None] if x.ndim == 1 else x
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"{name} must be [n_seeds, n_tokens] per-token values, got shape {x.shape}")
    if n_tokens is not None and x.shape[1] != n_tokens:
        raise ValueError(f"{name} has {x.shape[1]} tokens, the units array {n_tokens}: score the same tokens")
    return x


def _units(units, what: str) -> tuple[np.ndarray, int, np.ndarray, float]:
    """The unit index 0..G-1 of every token, G, the tokens of each unit [G] and their total N."""
    units = np.asarray(units)
    if units.ndim != 1:
        raise ValueError(f"units must be [n_tokens] ids (the family, or document, of each token), got {units.shape}")
    _, index = np.unique(units, return_inverse=True)
    G = int(index.max()) + 1 if len(index) else 0
    if G < 2:
        raise ValueError(f"{what} needs tokens of at least 2 independent units (families or documents): score more")
    n_g = np.bincount(index, minlength=G).astype(np.float64)
    return index, G, n_g, float(n_g.sum())


def _unit_sums(x: np.ndarray, index: np.ndarray, G: int) -> np.ndarray:
    """[n_seeds, G] sums of each seed's values over each unit."""
    out = np.zeros((x.shape[0], G))
    for s in range(x.shape[0]):
        out[s] = np.bincount(index, weights=x[s], minlength=G)
    return out


def cr2_weights(w: np.ndarray) -> np.ndarray:
    """[G] CR2 factors c_g of the squared unit residuals of a token-weighted mean (module docstring), unit
    shares ``w`` [G]: under the working model Var(D_g) ~ n_g^2, E[sum_g c_g r_g^2] = Var(sum_g D_g)."""
    return 1.0 / (1.0 - 2.0 * w + float(np.sum(w**2)))


def _bell_mccaffrey(w: np.ndarray) -> float:
    """Degrees of freedom of sum_g c_g r_g^2 under the working model (Bell and McCaffrey 2002, as Pustejovsky and
    Tipton 2018 write them, section 3): (tr C M)^2 / tr (C M C M), M = Var(r) = P S P', r = P D, P = I - w 1',
    S = Var(D) = diag(w^2) (unit means of equal variance). M is diagonal plus rank 2 (M = diag(s) + U B U',
    U = [w, s]), so both traces take O(G), for thousands of units too."""
    c, sq = cr2_weights(w), w**2
    U = np.stack([w, sq], axis=1)
    B = np.array([[sq.sum(), -1.0], [-1.0, 0.0]])
    diag_M = sq * (1 - 2 * w) + w**2 * sq.sum()
    K1, K2 = U.T @ (U * (c**2 * sq)[:, None]), U.T @ (U * c[:, None])
    tr_CMCM = float((c**2 * sq**2).sum() + 2 * np.trace(B @ K1) + np.trace(B @ K2 @ B @ K2))
    return float((c * diag_M).sum() ** 2 / tr_CMCM)


def _text_part(D: np.ndarray, noise: np.ndarray, n_g: np.ndarray, N: float) -> tuple[float, float]:
    """(V_text - V_noise, df) of the text: D [G] the unit sums of the seed-averaged values, noise [G] the
    variance of each unit's seed-averaged token noise (0 where not estimable)."""
    w = n_g / N
    theta = D.sum() / N
    c = cr2_weights(w)
    v_text = float((c * (D - theta * n_g) ** 2).sum()) / N**2
    # noise_g is already E[r_g^2] of noise alone (_seed_parts takes each seed's mean out: the (1 - 2 w_g) is in it)
    v_noise = float((c * noise).sum()) / N**2
    return max(0.0, v_text - v_noise), _bell_mccaffrey(w)


def _seed_parts(sums: np.ndarray, n_g: np.ndarray, N: float) -> tuple[float, np.ndarray]:
    """(V_seed, noise [G]) of one cell from its [n_seeds, G] unit sums: the variance of its seed mean, and of
    each unit's seed-averaged sum from seed to seed (the token noise; 0 with one seed)."""
    n = sums.shape[0]
    if n < 2:
        return 0.0, np.zeros(sums.shape[1])
    m = sums.sum(1) / N  # per-seed means
    v_seed = float(np.var(m, ddof=1) / n)
    resid = sums - sums.mean(0) - np.outer(m - m.mean(), n_g)
    return v_seed, (resid**2).sum(0) / ((n - 1) * n)


# A part holding at least this share of the estimated variance caps the degrees of freedom at its own (``_df``).
DOMINANT_SHARE = 0.6


def _df(parts: list[tuple[float, float]]) -> float:
    """Degrees of freedom of sum_i V_i, parts [(V_i, df_i)]: Welch-Satterthwaite, V^2 / sum V_i^2 / df_i, but never
    more than the own df of a part that holds DOMINANT_SHARE of V or more.

    Why the cap. Welch-Satterthwaite plugs the estimated parts in. Where one part of few df dominates (the
    memory verdict: xl:mem32's seeds, 2 df, against xl:nomem's, whose seed SD is about 0, and no file effect),
    the draws in which that part's estimate is small by chance are the ones in which the others' share, and so
    the df, rise: the variance is underestimated and the t quantile shrinks at once. The true df of such a sum
    is about the dominant part's (at most df_j / share_j^2), so the cap costs nothing where the part truly
    dominates and guards the draws where it only seems not to. 0.6 is the smallest share (of 0.5, 0.6, 0.75)
    that held coverage at 0.95 or more in the memory configuration (coverage.py; analysis/README.md) while
    widening the default split's xl - shaw interval by about 6% (0.5: 44%); the cap is a rule of thumb checked
    by simulation, not a theorem (Mickey and Brown 1966 bound the df between the smallest part's and the sum)."""
    V = sum(v for v, _ in parts)
    df = V**2 / sum(v**2 / d for v, d in parts if v > 0 and d > 0)
    return float(min([df] + [d for v, d in parts if v >= DOMINANT_SHARE * V and d > 0]))


def _third(D: np.ndarray, n_g: np.ndarray, N: float) -> float:
    """The third cumulant of the text part of the estimate, sum_g c_g^(3/2) r_g^3 / N^3 (the CR2 factors of
    ``_text_part`` for the residuals' shrinkage), D [G] the unit sums of the seed-averaged values."""
    r = D - D.sum() / N * n_g
    return float((cr2_weights(n_g / N) ** 1.5 * r**3).sum() / N**3)


def _hall(t: float, a: float) -> float:
    """Hall's (1992) transformation of a studentized mean, monotone in t, that removes the first-order effect of
    a skewness a of the estimate (the t of a right-skewed mean is skewed left): g(t) = t + a t^2 / 3 + a^2 t^3 / 27
    + a / 6, compared with the t distribution."""
    return t + a * t**2 / 3 + a**2 * t**3 / 27 + a / 6


def _hall_inverse(y: float, a: float) -> float:
    return y if a == 0 else float(3 / a * (np.cbrt(1 + a * (y - a / 6)) - 1))


def _bounds(estimate: float, se: float, df: float, a: float, level: float) -> tuple[float, float]:
    """The interval {theta: |g((estimate - theta) / se)| <= t_df} (``_hall``; a = 0: the t interval)."""
    if not se > 0:
        return estimate, estimate
    q = float(scipy_stats.t.ppf(0.5 + level / 2, df))
    return estimate - se * _hall_inverse(q, a), estimate - se * _hall_inverse(-q, a)


def _interval(
    estimate: float, parts: list[tuple[float, float]], level: float, third: float = 0.0, **facts
) -> Difference:
    """Interval from variance parts [(V_i, df_i)], df by ``_df``, skewness-corrected by the text part's third
    cumulant ``third`` (Hall's transformation: skewed unit effects left 7.5% of the t intervals wholly below the
    truth and 1.0% above in the coverage simulation; analysis/README.md)."""
    V = sum(v for v, _ in parts)
    if V <= 0:
        return Difference(estimate, estimate, estimate, level, 0.0, float("inf"), **facts)
    df, a = _df(parts), third / V**1.5
    low, high = _bounds(estimate, float(np.sqrt(V)), df, a, level)
    return Difference(estimate, low, high, level, float(np.sqrt(V)), float(df), skew=float(a), **facts)


def _check_pooled(seed_var) -> tuple[float, float] | None:
    if seed_var is None:
        return None
    v, df = seed_var
    if not (np.isfinite(v) and v >= 0 and df >= 1):
        raise ValueError(f"seed_var must be (the variance of one seed's mean >= 0, its df >= 1), got {seed_var}")
    return float(v), float(df)


def paired_difference(
    a, b, units, level: float, paired_seeds: bool = False, seed_var: tuple[float, float] | None = None
) -> Difference:
    """mean(a) - mean(b) and its interval (module docstring), in the unit of the values (nats, or 0/1 for
    an accuracy).

    a: [n_seeds_a, n_tokens] per-token values of cell a; b: [n_seeds_b, n_tokens] of cell b, on the same
    tokens; units: [n_tokens] ids, the independent unit of each token (its family on pystdlib, its document or
    chunk elsewhere). Different cells' seeds are analysed as independent (module docstring: measured).
    paired_seeds: a and b come from the same runs (seed s of a is seed s of b, e.g. one run evaluated at two
    lengths); the difference is then taken seed by seed.
    seed_var: (s^2, df), a seed variance pooled over cells that share one (``pooling.seed_pooling``): the variance
    of one seed's mean, with its df; the seed part is then s^2 (1 / n_a + 1 / n_b) on df, not each cell's own.
    """
    seed_var = _check_pooled(seed_var)
    units = np.asarray(units)
    if units.ndim != 1:
        raise ValueError(f"units must be [n_tokens] ids (the family, or document, of each token), got {units.shape}")
    a, b = _as_seeds(a, "a", len(units)), _as_seeds(b, "b", len(units))
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return NOT_EVALUATED
    if paired_seeds:
        if a.shape[0] != b.shape[0]:
            raise ValueError(f"paired_seeds needs the same seeds on both sides, got {a.shape[0]} and {b.shape[0]}")
        return mean_interval(a - b, units, level, seed_var)
    index, G, n_g, N = _units(units, "a difference")
    A, B = _unit_sums(a, index, G), _unit_sums(b, index, G)
    estimate = float(A.sum(1).mean() / N - B.sum(1).mean() / N)
    seed_a, noise_a = _seed_parts(A, n_g, N)
    seed_b, noise_b = _seed_parts(B, n_g, N)
    text, df_text = _text_part(A.mean(0) - B.mean(0), noise_a + noise_b, n_g, N)
    parts = [(seed_a, a.shape[0] - 1), (seed_b, b.shape[0] - 1), (text, df_text)]
    if seed_var is not None:  # one pooled estimate serves both cells: one part, its df
        parts = [(seed_var[0] * (1 / a.shape[0] + 1 / b.shape[0]), seed_var[1]), (text, df_text)]
    facts = dict(n_a=a.shape[0], n_b=b.shape[0], units=G, covers_seeds=min(a.shape[0], b.shape[0]) >= 2)
    third = _third(A.mean(0) - B.mean(0), n_g, N)
    return _interval(estimate, parts, level, third, largest_share=float(n_g.max() / N), **facts)


def mean_interval(a, units, level: float, seed_var: tuple[float, float] | None = None) -> Difference:
    """The mean of one cell, [n_seeds, n_tokens], with its interval (the same units as paired_difference; seed_var:
    a pooled seed variance, as there)."""
    seed_var = _check_pooled(seed_var)
    units = np.asarray(units)
    a = _as_seeds(a, "a", len(units))
    if not np.isfinite(a).all():
        return NOT_EVALUATED
    index, G, n_g, N = _units(units, "an interval")
    return sums_interval(_unit_sums(a, index, G), n_g, level, seed_var)


def sums_interval(
    A: np.ndarray, n_g: np.ndarray, level: float, seed_var: tuple[float, float] | None = None
) -> Difference:
    """``mean_interval`` from the unit sums A [n_seeds, G] and the units' scored tokens n_g [G] (for resampling
    units without going back to the tokens: a unit drawn twice is two units); seed_var as there."""
    N = float(n_g.sum())
    estimate = float(A.sum(1).mean() / N)
    seed, noise = _seed_parts(A, n_g, N)
    text, df_text = _text_part(A.mean(0), noise, n_g, N)
    facts = dict(n_a=A.shape[0], n_b=A.shape[0], units=len(n_g), covers_seeds=A.shape[0] >= 2)
    parts = [(seed, A.shape[0] - 1) if seed_var is None else (seed_var[0] / A.shape[0], seed_var[1]), (text, df_text)]
    return _interval(estimate, parts, level, _third(A.mean(0), n_g, N), largest_share=float(n_g.max() / N), **facts)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error control, any dependence); NaN stays NaN."""
    p = np.asarray(p_values, dtype=np.float64)
    finite = np.flatnonzero(np.isfinite(p))
    adjusted = np.full(len(p), np.nan)
    order = finite[np.argsort(p[finite], kind="stable")]
    m, running = len(order), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted.tolist()
