"""The one estimator of the report: a difference of mean per-token losses between two cells, with an
interval whose units are the training seed and the evaluation document.

Why these units. A claim about a scheme is a claim over training seeds (another seed, another model) and
over text (another document of the same kind). Tokens are not independent: neighbouring tokens share
their context, and a document's tokens share its topic and style, so the losses of one document are
correlated over hundreds of tokens. Resampling tokens, or short blocks of them, treats a few long
documents as thousands of independent pieces and gives intervals far too narrow. Here the document is
the unit of the text and the seed the unit of training.

The model. For cell a (runs equal but for their seed) with seeds s = 1..n_a and documents k = 1..K
(n_k scored tokens each, N in all), write the per-seed document sums A[s, k] = sum_{t in k} a[s, t]:

    A[s, k] = n_k (mu_a + alpha_s) + U_k + W_sk

alpha_s: the seed's effect (variance sigma_a^2); U_k: the document's effect, shared by every seed of the
cell and paired with cell b's through the text; W_sk: what a seed does on a document (token noise,
seed-by-document interaction). The estimate is theta = mean_s m_a[s] - mean_s m_b[s], m_a[s] = sum_k
A[s, k] / N, and

    Var(theta) = sigma_a^2/n_a + sigma_b^2/n_b + Var(sum_k (U_k - V_k))/N^2 + sum_k (w_ak/n_a + w_bk/n_b)/N^2

estimated from three moment sums (no resampling):

    V_seed_a = var_s(m_a) / n_a            seeds and their token noise    (df n_a - 1)
    V_text   = K/(K-1) sum_k (D_k - theta n_k)^2 / N^2,  D_k = mean_s A[s,k] - mean_s B[s,k]
               documents, and the token noise once more
    V_noise  = sum_k sum_s (A[s,k] - mean_s A[s,k] - n_k (m_a[s] - mean m_a))^2 / ((n_a - 1) n_a N^2) + (b)
               the token noise alone, so that it is not counted twice
    V        = V_seed_a + V_seed_b + max(0, V_text - V_noise)

The interval is theta +- t_{df} sqrt(V), df by Welch-Satterthwaite over the three parts (seeds of a, of
b: n - 1 each; documents: K - 1). With 3 seeds a side df is small and the interval wide: that is what 3
seeds know. A cell with one seed has no seed variance to estimate: its interval covers the text only
(``covers_seeds`` is False and the report says so).

Assumptions: seeds are exchangeable and independent between cells; documents are independent and scored
with the same tokens for every run (the paired design); every effect is additive on the loss scale; the
mean of a cell over documents is token-weighted (a document counts by its scored tokens). The coverage
of the 95% interval is checked by simulation in tests/test_stats.py under per-document effects, AR(1)
token noise up to phi = 0.99 and seed SDs up to 0.05 nats (table in analysis/README.md).
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
    seeds; ``documents``: K. ``covers_seeds``: both cells had >= 2 seeds (else the text alone)."""

    estimate: float
    low: float
    high: float
    level: float
    se: float
    df: float
    n_a: int
    n_b: int
    documents: int
    covers_seeds: bool

    def p_value(self, predicted: str) -> float:
        """One-sided p of the null "not in the predicted direction" (predicted "<0" or ">0")."""
        if predicted not in ("<0", ">0"):
            raise ValueError(f"predicted must be '<0' or '>0', got {predicted!r}")
        if not np.isfinite(self.estimate):
            return float("nan")
        if self.identical:  # rounding decides no sign
            return 1.0
        if self.se == 0:
            side = self.estimate < 0 if predicted == "<0" else self.estimate > 0
            return 0.0 if side and abs(self.estimate) > EPS else 1.0
        t = self.estimate / self.se
        return float(scipy_stats.t.cdf(t, self.df) if predicted == "<0" else scipy_stats.t.sf(t, self.df))

    def at(self, level: float) -> Difference:
        """The same estimate with its interval at another level (e.g. a Holm-adjusted one)."""
        half = float(scipy_stats.t.ppf(0.5 + level / 2, self.df) * self.se) if self.se > 0 else 0.0
        return replace(self, low=self.estimate - half, high=self.estimate + half, level=level)

    def scaled(self, k: float) -> Difference:
        """In other units (nats -> bits: k = 1 / ln 2)."""
        low, high = sorted((self.low * k, self.high * k))
        return replace(self, estimate=self.estimate * k, low=low, high=high, se=self.se * abs(k))

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


def _as_seeds(x, name: str, n_tokens: int | None) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    x = x[None] if x.ndim == 1 else x
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"{name} must be [n_seeds, n_tokens] per-token values, got shape {x.shape}")
    if n_tokens is not None and x.shape[1] != n_tokens:
        raise ValueError(f"{name} has {x.shape[1]} tokens, the documents array {n_tokens}: score the same tokens")
    return x


def _documents(documents: np.ndarray, what: str) -> tuple[np.ndarray, int, np.ndarray, float]:
    """The document index 0..K-1 of every token, K, the tokens of each document [K] and their total N."""
    _, index = np.unique(documents, return_inverse=True)
    K = int(index.max()) + 1
    if K < 2:
        raise ValueError(f"{what} needs tokens of at least 2 documents: score more text")
    n_k = np.bincount(index, minlength=K).astype(np.float64)
    return index, K, n_k, float(n_k.sum())


def _document_sums(x: np.ndarray, index: np.ndarray, K: int) -> np.ndarray:
    """[n_seeds, K] sums of each seed's values over each document."""
    out = np.zeros((x.shape[0], K))
    for s in range(x.shape[0]):
        out[s] = np.bincount(index, weights=x[s], minlength=K)
    return out


def _seed_parts(sums: np.ndarray, n_k: np.ndarray, N: float) -> tuple[float, float]:
    """(V_seed, V_noise) of one cell from its [n_seeds, K] document sums (0, 0 with one seed)."""
    n = sums.shape[0]
    if n < 2:
        return 0.0, 0.0
    m = sums.sum(1) / N  # per-seed means
    v_seed = float(np.var(m, ddof=1) / n)
    resid = sums - sums.mean(0) - np.outer(m - m.mean(), n_k)
    v_noise = float((resid**2).sum() / ((n - 1) * n * N**2))
    return v_seed, v_noise


def _interval(estimate: float, parts: list[tuple[float, float]], level: float, **facts) -> Difference:
    """t interval from variance parts [(V_i, df_i)] (Welch-Satterthwaite)."""
    V = sum(v for v, _ in parts)
    if V <= 0:
        return Difference(estimate, estimate, estimate, level, 0.0, float("inf"), **facts)
    df = V**2 / sum(v**2 / d for v, d in parts if v > 0 and d > 0)
    half = float(scipy_stats.t.ppf(0.5 + level / 2, df) * np.sqrt(V))
    return Difference(estimate, estimate - half, estimate + half, level, float(np.sqrt(V)), float(df), **facts)


def paired_difference(a, b, documents, level: float = 0.95, paired_seeds: bool = False) -> Difference:
    """mean(a) - mean(b) and its interval (module docstring), in the unit of the values (nats, or 0/1 for
    an accuracy).

    a: [n_seeds_a, n_tokens] per-token values of cell a; b: [n_seeds_b, n_tokens] of cell b, on the same
    tokens; documents: [n_tokens] int, the document of each token. Different cells have independent seeds.
    paired_seeds: a and b come from the same runs (seed s of a is seed s of b, e.g. one run evaluated at two
    lengths); the difference is then taken seed by seed.
    """
    documents = np.asarray(documents)
    if documents.ndim != 1:
        raise ValueError(f"documents must be [n_tokens] ints, got shape {documents.shape}")
    a, b = _as_seeds(a, "a", len(documents)), _as_seeds(b, "b", len(documents))
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return NOT_EVALUATED
    if paired_seeds:
        if a.shape[0] != b.shape[0]:
            raise ValueError(f"paired_seeds needs the same seeds on both sides, got {a.shape[0]} and {b.shape[0]}")
        return mean_interval(a - b, documents, level)
    index, K, n_k, N = _documents(documents, "a difference")
    A, B = _document_sums(a, index, K), _document_sums(b, index, K)
    estimate = float(A.sum(1).mean() / N - B.sum(1).mean() / N)
    D = A.mean(0) - B.mean(0)
    v_text = K / (K - 1) * float(((D - estimate * n_k) ** 2).sum()) / N**2
    seed_a, noise_a = _seed_parts(A, n_k, N)
    seed_b, noise_b = _seed_parts(B, n_k, N)
    parts = [(seed_a, a.shape[0] - 1), (seed_b, b.shape[0] - 1), (max(0.0, v_text - noise_a - noise_b), K - 1)]
    facts = dict(n_a=a.shape[0], n_b=b.shape[0], documents=K, covers_seeds=min(a.shape[0], b.shape[0]) >= 2)
    return _interval(estimate, parts, level, **facts)


def mean_interval(a, documents, level: float = 0.95) -> Difference:
    """The mean of one cell, [n_seeds, n_tokens], with its interval (the same units as paired_difference)."""
    documents = np.asarray(documents)
    a = _as_seeds(a, "a", len(documents))
    if not np.isfinite(a).all():
        return NOT_EVALUATED
    index, K, n_k, N = _documents(documents, "an interval")
    A = _document_sums(a, index, K)
    estimate = float(A.sum(1).mean() / N)
    v_text = K / (K - 1) * float(((A.mean(0) - estimate * n_k) ** 2).sum()) / N**2
    seed, noise = _seed_parts(A, n_k, N)
    facts = dict(n_a=a.shape[0], n_b=a.shape[0], documents=K, covers_seeds=a.shape[0] >= 2)
    return _interval(estimate, [(seed, a.shape[0] - 1), (max(0.0, v_text - noise), K - 1)], level, **facts)


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
