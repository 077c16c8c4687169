"""Retrieval reach on the recall probe: answer accuracy by distance bin with intervals, and the **reach**, the
largest distance whose accuracy lies above chance, with a bootstrap interval over seeds and units.

A bin is (lo, hi] of ``width`` distances (D counted from the query marker back to the planted value,
``posenc_lab.data.recall``). Its accuracy is the seeds' mean (each answer counts once, its seeds' hits
averaged); its interval a Wilson interval over the bin's answers widened by the design effect of the probe's units
(chunks of a few items), at ``level``. Why not ``stats.mean_interval``: with 2-3 seeds its seed part has 1-2
degrees of freedom, so a bin far above chance still reads "not above" at a joint level, and two seeds with
the same count of hits in a bin (common with 0/1 values) collapse its interval to a point. Wilson's interval
on a [0, 1] value is valid without that (its variance is at most p (1 - p)); under the null "nothing of the
planted value reaches the answer" each hit is at most a 1/n_values draw given all else, whatever the model.
The seeds' spread shows in each seed's own reach (``per_seed``) and in the bootstrap.

The reach is the largest distance up to which every bin's *simultaneous* interval (Bonferroni over the cell's
bins, jointly at ``level``) lies above chance: a cell at chance at every distance reads "none" with probability
>= level, and a far bin that comes out high by luck does not extend it (``above_chance`` gives every bin's
reading, the farthest above chance among them). Its interval: the percentiles of the same estimate over
``n_boot`` replicates that resample the seeds and the units (a cluster bootstrap); "none" counts as 0 there.

Only answers whose planted value lies inside the evaluated stream count: the as-trained evaluation starts each
stream with an empty memory, and an answer at target j of a stream (j = 0, 1, ...) has its value inside it only
if j >= D. Those before are not a failure of the model's reach.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from .dumps import TokenLosses
from .runs import Run


@dataclass(frozen=True)
class Answers:
    """One cell's answers: ``correct`` [n_seeds, n] 0/1 hits (the same answers for every seed), ``distance`` [n],
    ``units`` [n] (the unit of independence of each)."""

    correct: np.ndarray
    distance: np.ndarray
    units: np.ndarray

    def __post_init__(self):
        if self.correct.ndim != 2 or not self.correct.shape[1] == len(self.distance) == len(self.units):
            raise ValueError(
                f"Answers: correct must be [n_seeds, n] with n = len(distance) = len(units), got {self.correct.shape}, "
                f"{len(self.distance)}, {len(self.units)}"
            )

    def take(self, seeds: np.ndarray | slice, index: np.ndarray, units: np.ndarray | None = None) -> Answers:
        return Answers(
            self.correct[seeds][:, index], self.distance[index], self.units[index] if units is None else units
        )


def answers(runs: list[Run], dumps: dict[str, TokenLosses]) -> Answers:
    """A cell's answers (its runs' as-trained dumps, scored on the same tokens) whose value lies in the stream."""
    d0 = dumps[runs[0].name]
    column = np.broadcast_to(np.arange(d0.distance.shape[1]), d0.distance.shape)
    keep = d0.scored & (d0.distance >= 0) & (column >= d0.distance)
    correct = np.stack([dumps[r.name].correct[0][keep] for r in runs]).astype(np.float64)
    return Answers(correct, d0.distance[keep], d0.units[keep])


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
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
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


def _seed_sd(correct: np.ndarray, b: np.ndarray, B: int) -> np.ndarray:
    """[B] the SD of the seeds' own accuracies in each bin (NaN with one seed): their spread, beside the interval."""
    if correct.shape[0] < 2:
        return np.full(B, np.nan)
    n = np.bincount(b, minlength=B)
    per_seed = np.stack([np.bincount(b, c, minlength=B) / n for c in correct])
    return per_seed.std(0, ddof=1)


def above_chance(a: Answers, width: int, chance: float, level: float) -> pd.DataFrame:
    """``bin_intervals`` at the joint level of the cell's bins (Bonferroni) and ``above``: low > chance."""
    n_bins = len(np.unique(bins(a.distance, width)))
    t = bin_intervals(a, width, 1 - (1 - level) / max(1, n_bins))
    t["above"] = t["low"] > chance
    return t


def reach(a: Answers, width: int, chance: float, level: float) -> int:
    """The largest distance up to which every bin's simultaneous interval (Bonferroni over the cell's bins,
    jointly at ``level``) lies above ``chance``; 0: the nearest bin's does not. Up to, not the farthest bin
    above chance anywhere: a far bin that comes out high by luck (rare at the joint level, but common in the
    bootstrap's replicates, which add their own noise) does not move it."""
    if not len(a.distance):
        return 0
    t = above_chance(a, width, chance, level)
    below = np.flatnonzero(~t["above"].to_numpy())
    last = len(t) if not len(below) else below[0]
    return int(t["largest"].iloc[last - 1]) if last else 0


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


def reach_interval(a: Answers, width: int, chance: float, level: float, n_boot: int, seed: int = 0) -> Reach:
    """``reach`` with its percentile interval over ``n_boot`` replicates resampling seeds and units."""
    estimate = reach(a, width, chance, level)
    _, index = np.unique(a.units, return_inverse=True)
    counts = np.bincount(index)
    members = np.split(np.argsort(index, kind="stable"), np.cumsum(counts)[:-1])
    rng = np.random.default_rng(seed)
    S, G = a.correct.shape[0], len(counts)
    values = []
    for _ in range(n_boot):
        picks, seeds = rng.integers(0, G, G), rng.integers(0, S, S)
        rep = a.take(seeds, np.concatenate([members[p] for p in picks]), np.repeat(np.arange(G), counts[picks]))
        values.append(reach(rep, width, chance, level))
    tail = (1 - level) / 2
    low, high = (int(np.quantile(values, q, method=m)) for q, m in ((tail, "lower"), (1 - tail, "higher")))
    return Reach(estimate, low, high, int(a.distance.max()), level)


def per_seed(a: Answers, width: int, chance: float, level: float) -> list[int]:
    """Each seed's own reach (its hits alone), in the cell's seed order."""
    everything = np.arange(len(a.distance))
    return [reach(a.take([s], everything), width, chance, level) for s in range(a.correct.shape[0])]
