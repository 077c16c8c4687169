"""Retrieval reach on the recall probe: answer accuracy by distance bin, the chance rate of each bin estimated by
re-pairing the model's predictions with other items' values, and the **reach**, the largest distance up to which
every bin's accuracy lies above that estimated chance.

A bin is (lo, hi] of ``width`` distances (D counted from the query marker back to the planted value,
``posenc_lab.data.recall``). In bin b, with answers i = 1..n (each item's planted value v_i, its prediction
p_si by seed s = 1..S, the argmax token at the answer):

- accuracy:  acc_b = 1/(S n) sum_s sum_i [p_si = v_i]               (each answer once, its seeds averaged)
- chance:    null_b = 1/(S n^2) sum_s sum_i sum_j [p_si = v_j]      (the same predictions scored against
  another item's value, every pairing alike: the permutation mean; = sum_v share of predictions v x share of
  values v)
- gain:      acc_b - null_b, the estimand: what the prediction knows of its *own* item's value.

The null of bin b: "the predictions carry nothing of their own item's value", i.e. the values are exchangeable
over the bin's answers given the predictions (true past a cell's window: the probe draws each value
independently). Under it every re-pairing v_pi(i) of the values is as likely as the true one, so the
permutation test is exact whatever the model predicts, however skewed the values or the predictions, and
however the predictions of one stream (one unit) depend on each other (a prediction that copies another item's
value, seen earlier in its window, only makes some re-pairings hit: conservative). A fixed 1 / n_values assumes
what this estimates. The test: the p-value

    P_b = (1 + #{k : hits_b(pi_k) >= hits_b}) / (1 + K)                     (K random permutations pi_k)

where hits_b(pi) = sum_s sum_i [p_si = v_pi(i)] (valid for any K: the observed pairing counts as one
permutation). A bin is **above chance** when P_b <= (1 - level) / B, B the cell's bins (Bonferroni: all
bins jointly at ``level``, so a cell at chance everywhere shows no bin above with probability >= level and
``farthest_above`` is read at that level too). ``critical`` is the accuracy a bin must exceed for that.

The **reach**: the largest distance answered in the last bin of the run of bins above chance that starts at the
nearest bin (0: the nearest is not above). A bin beyond a cell's true reach is at its null, so the estimate
passes the true reach with probability <= 1 - level: it is a lower confidence bound. Its interval: the lower
percentile of the same estimate over ``n_boot`` replicates that resample the seeds and the units (a cluster
bootstrap), each replicate's bin accuracy against the data's ``critical``, up to the estimate: a replicate
cannot extend the reach through a bin the data do not show above chance (its resampling noise alone would do that
for a window-only cell, the bootstrap's known failure at a boundary), and no data bound the reach from above: a
bin past it may hold a gain too small to show. The seeds' spread shows in each seed's own reach (``per_seed``).

``bin_intervals`` gives each bin's accuracy with an interval for the table and the figure: Wilson's over the bin's
answers widened by the design effect of the probe's units (chunks of a few items).

Only answers whose planted value lies inside the evaluated stream count: the as-trained evaluation starts each
stream with an empty memory, and an answer at target j of a stream (j = 0, 1, ...) has its value inside it only
if j >= D. Those before are not a failure of the model's reach.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from .dumps import TokenLosses
from .runs import Run

PERMUTATIONS_PER_REJECTION = 20  # default K: the Bonferroni p-value threshold holds 20 permutations' worth


@dataclass(frozen=True)
class Answers:
    """One cell's answers: ``predicted`` [n_seeds, n] each seed's argmax token at the answer, ``value`` [n] the
    planted value (the token to answer), ``distance`` [n], ``units`` [n] (the unit of independence of each)."""

    predicted: np.ndarray
    value: np.ndarray
    distance: np.ndarray
    units: np.ndarray

    def __post_init__(self):
        n = len(self.value)
        if self.predicted.ndim != 2 or not self.predicted.shape[1] == n == len(self.distance) == len(self.units):
            raise ValueError(
                f"Answers: predicted must be [n_seeds, n] with n = len(value) = len(distance) = len(units), got "
                f"{self.predicted.shape}, {n}, {len(self.distance)}, {len(self.units)}"
            )

    @property
    def correct(self) -> np.ndarray:
        """[n_seeds, n] 0/1 hits."""
        return (self.predicted == self.value[None]).astype(np.float64)

    def take(self, seeds: np.ndarray | slice | list, index: np.ndarray, units: np.ndarray | None = None) -> Answers:
        units = self.units[index] if units is None else units
        return Answers(self.predicted[seeds][:, index], self.value[index], self.distance[index], units)


def answers(runs: list[Run], dumps: dict[str, TokenLosses]) -> Answers:
    """A cell's answers (its runs' as-trained dumps, scored on the same tokens) whose value lies in the stream."""
    d0 = dumps[runs[0].name]
    for r in runs:
        if dumps[r.name].predicted is None or dumps[r.name].target is None:
            raise ValueError(f"the dump of {r.name} holds no predictions: the reach needs an as-trained dump")
    column = np.broadcast_to(np.arange(d0.distance.shape[1]), d0.distance.shape)
    keep = d0.scored & (d0.distance >= 0) & (column >= d0.distance)
    predicted = np.stack([dumps[r.name].predicted[0][keep] for r in runs])
    return Answers(predicted, d0.target[keep], d0.distance[keep], d0.units[keep])


def bins(distance: np.ndarray, width: int) -> np.ndarray:
    """The bin k of each distance: (k width, (k + 1) width]."""
    if width < 1:
        raise ValueError(f"the reach's bin width must be >= 1 distance, got {width}")
    return (np.asarray(distance) - 1) // width


def bin_intervals(a: Answers, width: int, level: float) -> pd.DataFrame:
    """Per bin holding answers: bin_lo, bin_hi, answers, units, accuracy (the seeds' mean), its interval at
    ``level``, the largest distance answered and ``seed_sd`` (the seeds' spread). The interval: Wilson's on the
    seed-averaged hits of the bin's answers (a [0, 1] value of variance at most p (1 - p), so the interval never
    collapses on a bin of few answers), over n / deff answers, deff >= 1 the design effect of the units (their
    CR1 variance over the binomial one)."""
    _check_level(level)
    k = bins(a.distance, width)
    present, b = np.unique(k, return_inverse=True)
    _, u = np.unique(a.units, return_inverse=True)
    hits = a.correct.mean(0)  # [n]: each answer counts once, its seeds averaged
    B = len(present)
    n = np.bincount(b, minlength=B).astype(np.float64)
    p = np.bincount(b, hits, minlength=B) / n
    cell = u * B + b  # (unit, bin)
    y = np.bincount(cell, hits, minlength=(u.max() + 1) * B).reshape(-1, B)
    m = np.bincount(cell, minlength=(u.max() + 1) * B).reshape(-1, B).astype(np.float64)
    G = (m > 0).sum(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        v_units = G / np.maximum(G - 1, 1) * ((y - p * m) ** 2).sum(0) / n**2
        deff = np.where((G >= 2) & (p > 0) & (p < 1), v_units / (p * (1 - p) / n), 1.0)
    n_eff = n / np.maximum(deff, 1.0)
    z = float(scipy_stats.norm.ppf(0.5 + level / 2))
    centre = (p + z**2 / (2 * n_eff)) / (1 + z**2 / n_eff)
    half = z / (1 + z**2 / n_eff) * np.sqrt(p * (1 - p) / n_eff + z**2 / (4 * n_eff**2))
    return pd.DataFrame(
        {
            "bin_lo": present * width,
            "bin_hi": (present + 1) * width,
            "answers": n.astype(int),
            "units": G,
            "accuracy": p,
            "low": np.clip(np.minimum(centre - half, p), 0, 1),  # Wilson's holds p; rounding aside
            "high": np.clip(np.maximum(centre + half, p), 0, 1),
            "largest": np.array([a.distance[k == x].max() for x in present]),
            "seed_sd": _seed_sd(a.correct, b, B),
        }
    )


def _check_level(level: float) -> None:
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")


def _seed_sd(correct: np.ndarray, b: np.ndarray, B: int) -> np.ndarray:
    """[B] the SD of the seeds' own accuracies in each bin (NaN with one seed): their spread, beside the interval."""
    if correct.shape[0] < 2:
        return np.full(B, np.nan)
    n = np.bincount(b, minlength=B)
    per_seed = np.stack([np.bincount(b, c, minlength=B) / n for c in correct])
    return per_seed.std(0, ddof=1)


def default_permutations(n_bins: int, level: float) -> int:
    """K such that a bin's p-value can fall PERMUTATIONS_PER_REJECTION steps of 1 / (1 + K) below its
    Bonferroni threshold (1 - level) / n_bins."""
    return math.ceil(PERMUTATIONS_PER_REJECTION * max(1, n_bins) / (1 - level))


def _null_hits(predicted: np.ndarray, value: np.ndarray, n_perm: int, rng: np.random.Generator) -> np.ndarray:
    """predicted [S, m], value [m] -> [n_perm] the hits sum_s sum_i [p_si = v_pi(i)] of random re-pairings pi."""
    m = len(value)
    out = np.empty(n_perm, dtype=np.int64)
    chunk = max(1, 2_000_000 // max(1, m))  # permutations at once: memory, not the result
    for start in range(0, n_perm, chunk):
        k = min(chunk, n_perm - start)
        shuffled = value[rng.permuted(np.tile(np.arange(m), (k, 1)), axis=1)]  # [k, m]
        out[start : start + k] = sum((p[None] == shuffled).sum(1) for p in predicted)
    return out


def above_null(a: Answers, width: int, level: float, n_perm: int | None = None, seed: int = 0) -> pd.DataFrame:
    """``bin_intervals`` at ``level`` and, per bin, ``chance`` (the permutation mean null_b), ``above``
    (P_b <= (1 - level) / B over ``n_perm`` permutations; None: ``default_permutations``), ``p_value`` and, in bins
    above, ``critical`` (the accuracy to exceed; module doc). A bin is drawn until it can no longer be above:
    past (1 - level) / B (1 + n_perm) re-pairings at or above its hits, it stops, and its p-value is then
    Besag and Clifford's h / L (h such re-pairings in L drawn), the same decision with fewer draws."""
    t = bin_intervals(a, width, level)
    B = len(t)
    n_perm = n_perm or default_permutations(B, level)
    alpha = (1 - level) / max(1, B)
    allowed = math.floor(alpha * (1 + n_perm)) - 1  # re-pairings at or above the observed hits a bin may have
    if allowed < 0:
        raise ValueError(
            f"the reach's permutations must be >= {math.ceil(1 / alpha) - 1} for any of {B} bins to be above the "
            f"null at level {level}, got {n_perm}"
        )
    _, b = np.unique(bins(a.distance, width), return_inverse=True)
    rng = np.random.default_rng(seed)
    S = a.predicted.shape[0]
    chance, critical, p_value, above = np.empty(B), np.full(B, np.nan), np.empty(B), np.zeros(B, bool)
    for j in range(B):
        at = np.flatnonzero(b == j)
        pred, value = a.predicted[:, at], a.value[at]
        tokens = max(int(pred.max()), int(value.max())) + 1
        value_share = np.bincount(value, minlength=tokens) / value.size
        chance[j] = np.bincount(pred.ravel(), minlength=tokens) / pred.size @ value_share  # null_b: every pairing alike
        observed = int((pred == value[None]).sum())
        drawn, size, nulls = 0, 64, []
        while drawn < n_perm:
            null = _null_hits(pred, value, min(size, n_perm - drawn), rng)
            exceed = np.cumsum(null >= observed) + sum(int((x >= observed).sum()) for x in nulls)
            if exceed[-1] > allowed:  # it cannot be above any more
                stop = int(np.flatnonzero(exceed == allowed + 1)[0])
                p_value[j] = (allowed + 1) / (drawn + stop + 1)
                break
            drawn, size = drawn + len(null), 2 * size
            nulls.append(null)
        else:
            null = np.concatenate(nulls)
            p_value[j] = (1 + (null >= observed).sum()) / (1 + n_perm)
            above[j] = True  # at most `allowed` re-pairings at or above it: P_b <= alpha
            critical[j] = np.sort(null)[::-1][allowed] / (S * len(at))
    t["chance"], t["critical"], t["p_value"], t["above"] = chance, critical, p_value, above
    return t


def _run_end(above: np.ndarray, largest: np.ndarray) -> int:
    """The largest distance of the last bin of the run of ``above`` bins from the nearest; 0 if it is not above."""
    below = np.flatnonzero(~above)
    last = len(above) if not len(below) else below[0]
    return int(largest[last - 1]) if last else 0


def reach(a: Answers, width: int, level: float, n_perm: int | None = None, seed: int = 0) -> int:
    """The largest distance up to which every bin lies above its permutation null (simultaneously, at ``level``);
    0: the nearest bin does not. Up to, not the farthest bin above chance anywhere."""
    if not len(a.distance):
        return 0
    t = above_null(a, width, level, n_perm, seed)
    return _run_end(t["above"].to_numpy(), t["largest"].to_numpy())


@dataclass(frozen=True)
class Reach:
    estimate: int  # 0: none
    low: int
    high: int
    farthest: int  # the largest distance evaluated: a reach there may go further (censored)
    level: float

    @property
    def censored(self) -> bool:
        return self.estimate > 0 and self.estimate >= self.farthest

    def text(self) -> str:
        def one(v: int) -> str:
            return str(v) if v else "none"

        point = f">= {self.estimate}" if self.censored else one(self.estimate)
        return point if self.low == self.high == self.estimate else f"{point} [{one(self.low)}, {one(self.high)}]"


def reach_interval(
    a: Answers,
    width: int,
    level: float,
    n_boot: int,
    seed: int = 0,
    n_perm: int | None = None,
    table: pd.DataFrame | None = None,
) -> Reach:
    """``reach`` with its interval: the lower percentile over ``n_boot`` replicates resampling seeds and units, each
    replicate's bin accuracies against the data's ``critical`` and through bins the data show above chance, up to
    the estimate (module doc). ``table``: ``above_null`` of these answers if already computed."""
    if not len(a.distance):
        return Reach(0, 0, 0, 0, level)
    t = above_null(a, width, level, n_perm, seed) if table is None else table
    data_above, critical, largest = (t[c].to_numpy() for c in ("above", "critical", "largest"))
    estimate = _run_end(data_above, largest)
    _, b = np.unique(bins(a.distance, width), return_inverse=True)
    _, index = np.unique(a.units, return_inverse=True)
    counts = np.bincount(index)
    members = np.split(np.argsort(index, kind="stable"), np.cumsum(counts)[:-1])
    rng = np.random.default_rng(seed)
    hits = a.correct
    S, G, B = hits.shape[0], len(counts), len(t)
    values = []
    for _ in range(n_boot):
        picks, seeds = rng.integers(0, G, G), rng.integers(0, S, S)
        rows = np.concatenate([members[p] for p in picks])
        n = np.bincount(b[rows], minlength=B)
        with np.errstate(invalid="ignore", divide="ignore"):
            accuracy = np.bincount(b[rows], hits[seeds][:, rows].mean(0), minlength=B) / n
        with np.errstate(invalid="ignore"):  # critical is NaN where the data are not above: never above there
            values.append(_run_end(data_above & (n > 0) & (accuracy > critical), largest))
    tail = (1 - level) / 2
    low = int(np.quantile(values, tail, method="lower"))
    return Reach(estimate, low, estimate, int(a.distance.max()), level)


def per_seed(a: Answers, width: int, level: float, n_perm: int | None = None, seed: int = 0) -> list[int]:
    """Each seed's own reach (its predictions alone against their own permutation null), in the cell's seed order."""
    everything = np.arange(len(a.distance))
    return [reach(a.take([s], everything), width, level, n_perm, seed) for s in range(a.predicted.shape[0])]
