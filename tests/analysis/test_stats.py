"""The report's estimator (posenc_lab_analysis.stats): its interval covers a known difference at its nominal
rate under the dependence real text has, seeds are its unit of training, and the multiple-comparison and
edge-case rules hold.

The coverage simulation is also a script: ``python -m tests.analysis.test_stats`` prints the table of
analysis/README.md.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.signal import lfilter

from posenc_lab_analysis.stats import (
    EPS,
    _bell_mccaffrey,
    _df,
    _seed_parts,
    _text_part,
    _unit_sums,
    _units,
    cr2_weights,
    holm,
    mean_interval,
    p_text,
    paired_difference,
)

LEVEL = 0.95  # the level these tests study (the report's: ablate.analysis.level)

# ---- the simulation ------------------------------------------------------------------------------


def _ar1(rng, lengths: np.ndarray, phi: float, sd: float, n: int) -> np.ndarray:
    """[n, sum(lengths)] AR(1) noise, stationary with marginal SD ``sd``, independent per document."""
    K, L = len(lengths), int(lengths.max())
    e = rng.normal(0.0, sd * np.sqrt(1 - phi**2), size=(n, K, L))
    e[..., 0] = rng.normal(0.0, sd, size=(n, K))  # the stationary start
    x = lfilter([1.0], [1.0, -phi], e, axis=-1)
    return x[..., np.arange(L)[None, :] < lengths[:, None]]


def simulate(rng, phi: float, seed_sd: float, doc_sd: float, n_a: int = 3, n_b: int = 3, n_docs: int = 48):
    """Per-token losses of two cells with equal means on the same text (the true difference is 0): a text
    difficulty shared by both, a per-document effect of each cell, AR(1) token noise of each cell shared by its
    seeds and another of each seed, and a seed effect. Returns (a, b, documents)."""
    lengths = np.clip(rng.lognormal(np.log(300), 0.7, n_docs).astype(int), 60, 1500)
    documents = np.repeat(np.arange(n_docs), lengths)
    text = 2.0 + _ar1(rng, lengths, 0.9, 1.0, 1)[0]

    def cell(n):
        doc = rng.normal(0.0, doc_sd, n_docs)[documents]
        shared = _ar1(rng, lengths, phi, 0.15, 1)[0]
        own = _ar1(rng, lengths, phi, 0.15, n)
        return text + doc + shared + own + rng.normal(0.0, seed_sd, (n, 1))

    return cell(n_a), cell(n_b), documents


def coverage(phi: float, seed_sd: float, doc_sd: float, reps: int, seed: int = 0, level: float = 0.95) -> float:
    rng = np.random.default_rng([seed, int(phi * 1000), int(seed_sd * 1000), int(doc_sd * 1000)])
    hits = 0
    for _ in range(reps):
        a, b, documents = simulate(rng, phi, seed_sd, doc_sd)
        d = paired_difference(a, b, documents, level=level)
        hits += d.low <= 0.0 <= d.high
    return hits / reps


# Per-document effects (SD 0.05 nats of the difference, an ICC of about 0.05-0.1), AR(1) token noise up to
# phi 0.99 (a correlation length of 100 tokens), seed SDs 0, 0.02 and 0.05 nats, 3 seeds against 3.
SCENARIOS = [(phi, seed_sd, 0.05) for phi in (0.9, 0.97, 0.99) for seed_sd in (0.0, 0.02, 0.05)]


@pytest.mark.parametrize(("phi", "seed_sd", "doc_sd"), [SCENARIOS[0], SCENARIOS[5], SCENARIOS[8]])
def test_the_interval_covers_at_its_nominal_rate(phi, seed_sd, doc_sd):
    """600 simulated ablations per case (the standard error of a coverage of 0.95 is 0.009)."""
    assert 0.93 <= coverage(phi, seed_sd, doc_sd, reps=600) <= 0.97


@pytest.mark.slow
@pytest.mark.parametrize(("phi", "seed_sd", "doc_sd"), SCENARIOS)
def test_the_interval_covers_at_its_nominal_rate_in_every_case(phi, seed_sd, doc_sd):
    assert 0.93 <= coverage(phi, seed_sd, doc_sd, reps=1500, seed=1) <= 0.97


def test_resampling_tokens_would_undercover():
    """One seed a side (the text is all the uncertainty), every token its own document (what a token bootstrap
    assumes): far too narrow; with the documents as the units, nominal."""
    rng = np.random.default_rng(5)
    tokens = documents = 0
    for _ in range(200):
        a, b, docs = simulate(rng, 0.99, 0.0, 0.05, n_a=1, n_b=1)
        d = paired_difference(a, b, np.arange(a.shape[1]), LEVEL)
        tokens += d.low <= 0 <= d.high
        d = paired_difference(a, b, docs, LEVEL)
        documents += d.low <= 0 <= d.high
    assert tokens / 200 < 0.5 and 0.9 <= documents / 200 <= 0.99


# ---- what the interval is made of ------------------------------------------------------------------


def test_seeds_are_the_unit_of_training():
    """A seed effect widens the interval; with one seed a side it cannot be seen, and the result says so."""
    rng = np.random.default_rng(1)
    a, b, docs = simulate(rng, 0.9, 0.05, 0.0)
    wide = paired_difference(a, b, docs, LEVEL)
    narrow = paired_difference(
        a - a.mean(1, keepdims=True) + a.mean(), b - b.mean(1, keepdims=True) + b.mean(), docs, LEVEL
    )
    assert wide.covers_seeds and wide.high - wide.low > 2 * (narrow.high - narrow.low)
    one = paired_difference(a[:1], b[:1], docs, LEVEL)
    assert not one.covers_seeds and (one.n_a, one.n_b) == (1, 1) and one.units == 48
    assert 10 < one.df < 47  # the text alone: Bell-McCaffrey, below units - 1 for unequal units


def test_a_planted_difference_is_found_and_its_p_value_is_one_sided():
    rng = np.random.default_rng(2)
    a, b, docs = simulate(rng, 0.9, 0.01, 0.02)
    d = paired_difference(a - 0.1, b, docs, LEVEL)
    assert d.high < 0 and d.estimate == pytest.approx(a.mean() - 0.1 - b.mean())
    assert d.p_value("<0") < 1e-3 and d.p_value(">0") > 0.999
    assert d.p_value("<0") + d.p_value(">0") == pytest.approx(1.0)
    wider = d.at(0.999)
    assert wider.low < d.low and wider.high > d.high and wider.estimate == d.estimate


def test_paired_seeds_take_the_difference_run_by_run():
    """The same runs at two lengths: a seed effect common to both cancels (it widens independent cells)."""
    rng = np.random.default_rng(3)
    a, _, docs = simulate(rng, 0.9, 0.2, 0.0)
    shifted = a + 0.01 + rng.normal(0, 0.01, a.shape)
    paired = paired_difference(shifted, a, docs, LEVEL, paired_seeds=True)
    independent = paired_difference(shifted, a, docs, LEVEL)
    assert paired.low > 0 and independent.low < 0 < independent.high
    with pytest.raises(ValueError, match="same seeds on both sides"):
        paired_difference(a, a[:2], docs, LEVEL, paired_seeds=True)


def test_a_dominant_part_caps_the_degrees_of_freedom_at_its_own():
    """Welch-Satterthwaite over the parts, but a part holding 60% of the variance or more caps the df at its own
    (stats._df): the plugged-in df of a sum dominated by a 2-df part rises when that part is underestimated."""
    ws = lambda parts: sum(v for v, _ in parts) ** 2 / sum(v**2 / d for v, d in parts)  # noqa: E731
    dominated = [(0.7, 2.0), (0.1, 2.0), (0.2, 40.0)]
    assert ws(dominated) > 2.5 and _df(dominated) == 2.0
    balanced = [(0.5, 2.0), (0.45, 2.0), (0.05, 40.0)]
    assert _df(balanced) == pytest.approx(ws(balanced)) and _df(balanced) > 3.5
    text = [(0.05, 2.0), (0.05, 2.0), (0.9, 30.0)]
    assert ws(text) > 30.0 and _df(text) == 30.0  # the text's own Bell-McCaffrey df, whatever the seeds add


def test_a_mean_and_its_interval():
    rng = np.random.default_rng(4)
    a, _, docs = simulate(rng, 0.9, 0.02, 0.05)
    m = mean_interval(a, docs, LEVEL)
    assert m.low < a.mean() < m.high and m.estimate == pytest.approx(a.mean())


def test_bad_input_is_named():
    docs = np.repeat(np.arange(3), 4)
    with pytest.raises(ValueError, match=r"b has 5 tokens, the units array 12"):
        paired_difference(np.zeros((2, 12)), np.zeros((2, 5)), docs, LEVEL)
    with pytest.raises(ValueError, match="at least 2 independent units"):
        paired_difference(np.zeros((2, 12)), np.zeros((2, 12)), np.zeros(12, int), LEVEL)
    with pytest.raises(ValueError, match=r"level must be in \(0, 1\)"):
        paired_difference(np.zeros((2, 12)), np.zeros((2, 12)), docs, level=95)
    nan = paired_difference(np.full((2, 12), np.nan), np.zeros((2, 12)), docs, LEVEL)
    assert np.isnan(nan.estimate) and nan.text() == "n/a" and np.isnan(nan.p_value("<0"))


def test_rounding_is_not_a_difference():
    docs = np.repeat(np.arange(4), 5)
    same = paired_difference(np.ones((2, 20)), np.ones((2, 20)) + 1e-7, docs, LEVEL)
    assert same.identical and same.p_value("<0") == 1.0 and same.p_value(">0") == 1.0
    assert EPS < 1e-4


def test_holm_adjusts_step_down_and_keeps_order():
    p = [0.01, 0.04, 0.03, float("nan"), 0.2]
    adjusted = holm(p)
    assert adjusted[0] == pytest.approx(0.04) and adjusted[2] == pytest.approx(0.09)
    assert adjusted[1] == pytest.approx(0.09)  # monotone: never below an earlier step
    assert adjusted[4] == pytest.approx(0.2) and np.isnan(adjusted[3])


# ---- the family as the unit ---------------------------------------------------------------------------------


def _pustejovsky_tipton(y: np.ndarray, n: np.ndarray) -> tuple[float, float]:
    """CR2 variance and Bell-McCaffrey df of a weighted mean, written as Pustejovsky and Tipton (2018) write
    them for WLS (their eqs. 5-6 and 11), one observation per cluster: y [G] the unit means, weights W = n, the
    working model Phi = I (unit means of equal variance), X = 1."""
    G = len(y)
    X, W = np.ones((G, 1)), np.diag(n)
    M = np.linalg.inv(X.T @ W @ X)
    H = X @ M @ X.T @ W
    e = y - H @ y
    IH = np.eye(G) - H
    A = [1 / np.sqrt(IH[j] @ IH[j]) for j in range(G)]  # B_j = (I - H)_j Phi (I - H)_j', A_j = B_j^(-1/2)
    V = float(sum((M @ X[j] * n[j] * A[j] * e[j]) ** 2 for j in range(G)).item())
    P = np.stack([IH[j] * A[j] * n[j] * M[0, 0] for j in range(G)])  # p_j = (I - H)_j' A_j W_j X_j M
    Omega = P @ P.T  # p_i' Phi p_j
    return V, float(np.trace(Omega) ** 2 / np.sum(Omega**2))


def test_the_text_part_is_cr2_with_bell_mccaffrey_df_as_published():
    rng = np.random.default_rng(20)
    n = rng.integers(1, 40, 9).astype(float)
    units = np.repeat(np.arange(9), n.astype(int))
    y = rng.normal(0, 1, 9)
    a = (y[units] + rng.normal(0, 0.1, len(units)))[None]  # one seed a side: the text part alone
    d = paired_difference(a, np.zeros_like(a), units, LEVEL)
    ybar = np.bincount(units, weights=a[0]) / n
    V, df = _pustejovsky_tipton(ybar, n)
    assert d.se**2 == pytest.approx(V, rel=1e-9) and d.df == pytest.approx(df, rel=1e-9)
    equal = np.full(12, 0.5 / 6)
    assert _bell_mccaffrey(equal) == pytest.approx(11) and cr2_weights(equal) == pytest.approx(12 / 11)


def test_one_family_holding_half_the_tokens_gives_a_wide_interval():
    """The issue's layout (42 files, 14 families, asyncio 48% of the tokens), files of a family sharing half of
    their effect: with the files as units the 95% interval covers far less than 95% and is confident; with the
    families it covers, on one or two degrees of freedom, and is wide."""
    from posenc_lab_analysis.coverage import BEFORE, MEASURED, Components, Simulator

    comps = Components(**{**MEASURED.__dict__, "icc": 0.5, "file_sd": 0.05})
    sim, rng = Simulator(BEFORE, comps), np.random.default_rng(21)
    hits = {"file": 0, "family": 0}
    width = {"file": [], "family": []}
    for _ in range(200):
        a, b = sim.cell(rng, "a", 3), sim.cell(rng, "b", 3)
        for name, units in (("file", sim.file), ("family", sim.family)):
            d = paired_difference(a, b, units, LEVEL)
            hits[name] += d.low <= 0 <= d.high
            width[name].append(d.high - d.low)
    assert d.units == 14 and d.largest_share == pytest.approx(0.484, abs=0.01) and d.df < 4
    assert hits["file"] / 200 < 0.85 and hits["family"] / 200 >= 0.93
    assert np.median(width["family"]) > 2 * np.median(width["file"])


def test_p_values_below_what_the_df_support_print_as_a_bound():
    assert p_text(4.3e-225, 4.0) == "< 1e-3" and p_text(7e-26, 60.0) == "< 1e-4"
    assert p_text(0.0123, 4.0) == "0.012" and p_text(float("nan"), 4.0) == "n/a"
    assert p_text(5e-4, 60.0) == "0.0005"


def test_the_token_noise_is_taken_out_of_the_text_part_once_at_its_expected_size():
    """V_noise is what the token noise adds to V_text in expectation. With token noise alone (no unit, no seed
    effect) and a unit holding half the tokens, the V_noise the estimator subtracts averages to the noise's mean
    share of V_text: the (1 - 2 w) of the residual is applied once."""
    rng = np.random.default_rng(30)
    units = np.repeat(np.arange(6), [500, 200, 100, 100, 60, 40])
    index, G, n_g, N = _units(units, "a test")
    v_text, v_noise = [], []
    for _ in range(600):
        A = _unit_sums(rng.normal(0, 1, (3, len(units))), index, G)
        _, noise = _seed_parts(A, n_g, N)
        D = A.mean(0) + 1e3 * (-1.0) ** np.arange(G) * n_g  # a large text part: V_text - V_noise stays positive
        whole, _ = _text_part(D, np.zeros(G), n_g, N)
        v_noise.append(whole - _text_part(D, noise, n_g, N)[0])
        v_text.append(_text_part(A.mean(0), np.zeros(G), n_g, N)[0])
    assert np.mean(v_noise) == pytest.approx(np.mean(v_text), rel=0.04)


if __name__ == "__main__":  # the table of analysis/README.md
    print("| AR(1) phi | seed SD (nats) | document SD | coverage of the 95% interval (1,500 simulations) |")
    print("|---|---|---|---|")
    for phi, seed_sd, doc_sd in SCENARIOS:
        print(f"| {phi} | {seed_sd} | {doc_sd} | {coverage(phi, seed_sd, doc_sd, reps=1500, seed=1):.3f} |", flush=True)


def test_the_skewness_correction_is_hall_s_monotone_transformation():
    """g(t) = t + a t^2 / 3 + a^2 t^3 / 27 + a / 6 (Hall 1992) and its inverse; a = 0 is the t interval, and the
    interval and the one-sided p agree at every level (an interval excludes 0 exactly when p < (1 - level) / 2)."""
    from posenc_lab_analysis.stats import Difference, _hall, _hall_inverse

    for a in (-0.3, 0.0, 0.2):
        for t in (-4.0, -1.0, 0.5, 3.0):
            assert _hall_inverse(_hall(t, a), a) == pytest.approx(t)
    d = Difference(-0.02, 0, 0, 0.95, 0.01, 6.0, 3, 3, 30, True, skew=0.3).at(0.95)
    plain = Difference(-0.02, 0, 0, 0.95, 0.01, 6.0, 3, 3, 30, True).at(0.95)
    assert d.high - d.estimate > plain.high - plain.estimate and d.estimate - d.low < plain.estimate - plain.low
    for level in (0.8, 0.9, 0.95, 0.99):
        x = d.at(level)
        assert (x.high < 0) == (d.p_value("<0") < (1 - level) / 2)
