"""Uncertainty of the report's loss differences: a paired block bootstrap over evaluation tokens,
and over training seeds where a cell has several.

Every analysis scores the same tokens for every run, so a difference between two runs (or two
evaluation lengths of one run) is paired token by token. Neighbouring tokens of a row are
correlated (same text, same context), so the unit of resampling is a *block*: ``block``
consecutive scored tokens of one row. For a run, per-token losses ``l [n_rows, n_tokens]`` and the
tokens that count ``mask`` become block sums ``s [n_blocks]`` and counts ``n [n_blocks]``:

    mean loss        = sum_b s_b / sum_b n_b
    replicate k      : draw n_blocks blocks with replacement (multiplicities w_k [n_blocks]),
                       the same draw for every run (paired): mean_k = sum_b w_kb s_b / sum_b w_kb n_b

A *cell* (runs that differ only in ``seed``) holds ``[n_seeds, n_blocks]`` sums. Its mean is the
mean over seeds; a replicate also draws the seeds of each cell with replacement (hierarchical
bootstrap: training seed and evaluation text are both sources of variation). With one seed, the
interval covers the evaluation text only; with two, the seed part is underestimated (a bootstrap
of two values); the report says how many seeds each cell has.

The interval is the percentile interval of the replicates at ``level``. A finding predicts the
sign of a difference; ``verdict`` reads it from the interval: "reproduced" (entirely on the
predicted side), "contradicted" (entirely on the other side) or "inconclusive" (it holds 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

REPRODUCED, CONTRADICTED, INCONCLUSIVE = "reproduced", "contradicted", "inconclusive"
# The resolution of a mean of float32 losses (nats): an interval inside +-EPS is "identical" (e.g.
# an absolute scheme given more memory it cannot tell apart), not a difference. Not a threshold of
# importance: it only keeps rounding from deciding a sign.
EPS = 1e-5


def block_sums(loss: np.ndarray, mask: np.ndarray | None, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(sums, counts) of per-token ``loss [..., n_rows, n_tokens]`` over blocks of ``block``
    consecutive tokens of each row; ``mask [n_rows, n_tokens]`` (None: all) marks the tokens that
    count. Returns sums [..., n_rows * ceil(n_tokens / block)] and counts [n_rows * ...] (the last
    block of a row may be shorter). NaN losses (a length the run cannot serve) give NaN sums."""
    loss = np.asarray(loss, dtype=np.float64)
    n_rows, n_tok = loss.shape[-2:]
    if block < 1:
        raise ValueError(f"bootstrap block must be >= 1 token, got {block}")
    mask = np.ones((n_rows, n_tok), bool) if mask is None else np.asarray(mask, bool)
    if mask.shape != (n_rows, n_tok):
        raise ValueError(f"mask {mask.shape} does not match losses {loss.shape[-2:]}")
    n_b = -(-n_tok // block)
    pad = n_b * block - n_tok
    lead = loss.shape[:-2]
    x = np.where(mask, loss, 0.0)  # a counted token with a NaN loss keeps its block NaN
    x = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)]).reshape(*lead, n_rows, n_b, block)
    m = np.pad(mask, [(0, 0), (0, pad)]).reshape(n_rows, n_b, block)
    sums = x.sum(-1).reshape(*lead, n_rows * n_b)
    counts = m.sum(-1).reshape(n_rows * n_b).astype(np.float64)
    return sums, counts


@dataclass(frozen=True)
class Interval:
    """A point estimate and its bootstrap percentile interval at ``level``."""

    estimate: float
    lo: float
    hi: float
    level: float

    def text(self, d: int = 3, signed: bool = True) -> str:
        if not np.isfinite(self.estimate):
            return "n/a"
        f = f"{{:{'+' if signed else ''}.{d}f}}"
        return f"{f.format(self.estimate)} [{f.format(self.lo)}, {f.format(self.hi)}]"

    def scaled(self, k: float) -> Interval:
        lo, hi = sorted((self.lo * k, self.hi * k))
        return Interval(self.estimate * k, lo, hi, self.level)


NAN_INTERVAL = Interval(float("nan"), float("nan"), float("nan"), float("nan"))


def _multiplicities(idx: np.ndarray, n: int) -> np.ndarray:
    """[n_boot, n] counts of each of n items in each row of draws idx [n_boot, m]."""
    flat = (idx + n * np.arange(idx.shape[0])[:, None]).ravel()
    return np.bincount(flat, minlength=idx.shape[0] * n).reshape(idx.shape[0], n).astype(np.float64)


class Bootstrap:
    """Block multiplicities drawn once and shared by every estimate of one analysis (all runs
    scored on the same ``n_blocks`` blocks): every difference is paired, and differences computed
    from one Bootstrap are mutually consistent.

    n_boot: replicates. level: the interval's coverage. seed: of the resampling (reproducible)."""

    def __init__(self, n_blocks: int, n_boot: int = 2000, level: float = 0.95, seed: int = 0):
        if n_blocks < 2:
            raise ValueError(
                f"a bootstrap needs at least 2 blocks of tokens, got {n_blocks}; score more tokens "
                f"(ablate.analysis.context.n_rows / n_score) or use shorter blocks "
                f"(ablate.analysis.bootstrap.block)"
            )
        if not 0 < level < 1:
            raise ValueError(f"bootstrap level must be in (0, 1), got {level}")
        self.n_blocks, self.n_boot, self.level = n_blocks, n_boot, level
        self.rng = np.random.default_rng(seed)
        idx = self.rng.integers(0, n_blocks, size=(n_boot, n_blocks))
        self.w = _multiplicities(idx, n_blocks)  # w[k, b]: how often block b is in replicate k
        self._seed_draws: dict[int, np.ndarray] = {}

    def _seed_weights(self, k: int, key: int) -> np.ndarray:
        """[n_boot, k] multiplicities of k seeds drawn with replacement; ``key`` picks an independent
        draw (two cells) or the same one (one cell's seeds used twice: a paired contrast)."""
        if k == 1:
            return np.ones((self.n_boot, 1))
        if (k, key) not in self._seed_draws:
            rng = np.random.default_rng([k, key, self.n_boot])
            self._seed_draws[(k, key)] = _multiplicities(rng.integers(0, k, size=(self.n_boot, k)), k)
        return self._seed_draws[(k, key)]

    def _replicates(self, sums: np.ndarray, counts: np.ndarray, key: int) -> tuple[float, np.ndarray]:
        """(mean, [n_boot] replicate means) of one cell: sums [n_seeds, n_blocks]."""
        sums = np.atleast_2d(np.asarray(sums, dtype=np.float64))
        if sums.shape[1] != self.n_blocks or counts.shape != (self.n_blocks,):
            raise ValueError(
                f"block sums {sums.shape} / counts {counts.shape} do not match the bootstrap's {self.n_blocks} blocks"
            )
        per_seed = sums.sum(1) / counts.sum()  # [k]
        rep = (self.w @ sums.T) / (self.w @ counts)[:, None]  # [n_boot, k]
        v = self._seed_weights(sums.shape[0], key)
        return float(per_seed.mean()), (rep * v).sum(1) / v.sum(1)

    def mean(self, sums: np.ndarray, counts: np.ndarray) -> Interval:
        """The mean loss of one cell (sums [n_seeds, n_blocks] or [n_blocks]) with its interval."""
        est, rep = self._replicates(sums, counts, key=0)
        return self._interval(est, rep)

    def diff(self, a: np.ndarray, b: np.ndarray, counts: np.ndarray, same_runs: bool = False) -> Interval:
        """mean(a) - mean(b), paired over blocks. a, b: block sums [n_seeds, n_blocks] of two cells.
        same_runs: a and b come from the same runs (e.g. one run at two evaluation lengths), so their
        seeds are drawn together; otherwise each cell's seeds are drawn independently."""
        a, b = np.atleast_2d(a), np.atleast_2d(b)
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            return NAN_INTERVAL
        if same_runs and a.shape[0] != b.shape[0]:
            raise ValueError(
                f"a paired-seed contrast needs the same seeds on both sides, got {a.shape[0]} and {b.shape[0]}"
            )
        ea, ra = self._replicates(a, counts, key=1)
        eb, rb = self._replicates(b, counts, key=1 if same_runs else 2)
        return self._interval(ea - eb, ra - rb)

    def _interval(self, est: float, rep: np.ndarray) -> Interval:
        a = (1 - self.level) / 2
        lo, hi = np.quantile(rep, [a, 1 - a])
        return Interval(est, float(lo), float(hi), self.level)


def verdict(iv: Interval, predicted: str) -> str:
    """Read a finding from the interval of a difference whose predicted sign is "<0" or ">0"."""
    if predicted not in ("<0", ">0"):
        raise ValueError(f"predicted must be '<0' or '>0', got {predicted!r}")
    if not np.isfinite(iv.estimate) or identical(iv):
        return INCONCLUSIVE
    below, above = iv.hi < 0, iv.lo > 0
    if (below and predicted == "<0") or (above and predicted == ">0"):
        return REPRODUCED
    if below or above:
        return CONTRADICTED
    return INCONCLUSIVE


def identical(iv: Interval) -> bool:
    """The interval lies within float32 rounding of zero (``EPS`` in the interval's own units; the
    report scales nats to bits, which only loosens it by 1.44)."""
    return max(abs(iv.lo), abs(iv.hi)) < EPS


def sign_text(iv: Interval) -> str:
    """'lower' / 'higher' / 'not distinguishable' from the interval of a difference a - b."""
    if not np.isfinite(iv.estimate):
        return "not evaluated"
    if identical(iv):
        return "identical up to rounding"
    return "lower" if iv.hi < 0 else "higher" if iv.lo > 0 else "not distinguishable"


def combine(verdicts: list[str]) -> str:
    """A finding made of several comparisons (e.g. "xl beats every other row"): reproduced if all
    are, contradicted if any is, else inconclusive."""
    if not verdicts:
        return INCONCLUSIVE
    if any(v == CONTRADICTED for v in verdicts):
        return CONTRADICTED
    return REPRODUCED if all(v == REPRODUCED for v in verdicts) else INCONCLUSIVE
