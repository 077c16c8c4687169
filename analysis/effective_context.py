"""How much context a model uses, against its own loss: truncation curves and the effective context length
(Khandelwal et al. 2018, "Sharp Nearby, Fuzzy Far Away"; Sun et al. 2021, "Do Long-Range Language Models
Actually Use Long-Range Context?"). Pure numpy and pandas on per-token losses; no model here.

For a run (a cell's seed) with per-token losses l(c, t) at context c (every scored token sees exactly c previous
tokens: memory c with the same-length mask, or a sliding window of c), its curve is m(c) = mean_t l(c, t) and its
own best m* = min_c m(c), at c*. Then:

    gap(c)    = m(c) - m*                                            what truncating to c costs it (nats)
    c_eff     = the smallest c with m(c) <= (1 + fraction) m*        its effective context length

No other model enters (RECL's group baseline caps a model by the others' best: a model much worse than the rest
gains "relatively" from context it barely uses). Every value is per seed first; a cell's is the mean over its
seeds, so its value does not depend on how many seeds it has.

Intervals. ``gap`` per c: ``stats.mean_interval`` of the per-token l(c, t) - l(c*_s, t), seed s against its
own best c (seeds and the text's units; optimistic: c* is chosen on the same tokens). ``c_eff``: a cluster
bootstrap over the units (the same draw for every cell) and each cell's seeds, the curve and its best recomputed
on every replicate; percentile intervals. A seed whose c_eff is the last c it serves had not levelled off within
the grid: its c_eff is then a lower bound (``censored``).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .stats import mean_interval


@dataclass
class EffectiveContext:
    """``cells``: one row per cell: c_eff (mean over seeds), low, high, censored, seeds (each seed's), best_c;
    ``seeds``: one row per (cell, seed): c_eff, censored, best_c, best (nats); ``curves``: one row per (cell, c):
    loss (mean over seeds), gap with its interval (low, high), relative gap; ``replicates``: cell -> [n_boot] c_eff
    (for paired differences on the same draws of units)."""

    cells: pd.DataFrame
    seeds: pd.DataFrame
    curves: pd.DataFrame
    replicates: dict[str, np.ndarray]
    fraction: float
    level: float

    def difference(self, a: str, b: str) -> tuple[float, float, float]:
        """c_eff(a) - c_eff(b): the point value and the percentile interval of the same replicates."""
        t = self.cells.set_index("cell")
        est = float(t.loc[a, "c_eff"] - t.loc[b, "c_eff"])
        q = (1 - self.level) / 2
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            lo, hi = np.nanquantile(self.replicates[a] - self.replicates[b], [q, 1 - q])
        return est, float(lo), float(hi)


def effective(curve: np.ndarray, contexts: Sequence[int], fraction: float):
    """(c_eff, best_c, censored) of curves [..., n_c] (NaN: not served), along the last axis: the smallest c
    within ``fraction`` of the curve's own minimum, where the minimum lies, and whether c_eff is the last c served
    (the curve had not levelled off within the grid: c_eff is then a lower bound). NaN where nothing is served."""
    curve = np.asarray(curve, dtype=np.float64)
    c = np.asarray(contexts, dtype=np.float64)
    served = np.isfinite(curve)
    filled = np.where(served, curve, np.inf)
    best_k = filled.argmin(-1)
    best = np.take_along_axis(filled, best_k[..., None], -1)
    within = (served & (curve <= best * (1 + fraction))).argmax(-1)
    last = curve.shape[-1] - 1 - served[..., ::-1].argmax(-1)
    any_served = served.any(-1)
    c_eff = np.where(any_served, c[within], np.nan)
    best_c = np.where(any_served, c[best_k], np.nan)
    return c_eff, best_c, any_served & (within == last) & (served.sum(-1) > 1)


def _check(per_seed: dict[str, np.ndarray], contexts: Sequence[int], units: np.ndarray) -> None:
    if not per_seed:
        raise ValueError("the effective context needs at least one cell")
    if list(contexts) != sorted(set(contexts)):
        raise ValueError(f"contexts must be strictly increasing, got {list(contexts)}")
    for m, x in per_seed.items():
        if np.ndim(x) != 3 or np.shape(x)[1] != len(contexts) or np.shape(x)[2] != len(units):
            raise ValueError(
                f"cell {m}: losses must be [n_seeds, len(contexts)={len(contexts)}, n_tokens={len(units)}], got "
                f"{np.shape(x)}"
            )
        nan = np.isnan(x)
        if (nan.any(-1) & ~nan.all(-1)).any():
            s, k = np.argwhere(nan.any(-1) & ~nan.all(-1))[0]
            raise ValueError(f"cell {m} seed {s} has NaN losses for some tokens at c = {contexts[k]} (all or none)")


def analyze(
    per_seed: dict[str, np.ndarray],
    contexts: Sequence[int],
    units: np.ndarray,
    *,
    fraction: float,
    n_boot: int,
    level: float,
    seed: int = 0,
) -> EffectiveContext:
    """Own-baseline curves and effective contexts of every cell (module docstring). per_seed: cell -> [n_seeds,
    n_c, n_tokens] per-token losses (nats; NaN over a whole [c] slice where the cell cannot serve c), the same
    tokens for every cell; units: [n_tokens] the independent unit of each token."""
    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be in (0, 1), e.g. 0.01, got {fraction!r}")
    units = np.asarray(units)
    _check(per_seed, contexts, units)
    _, index = np.unique(units, return_inverse=True)
    G = int(index.max()) + 1
    n_g = np.bincount(index, minlength=G).astype(np.float64)
    rng = np.random.default_rng(seed)
    draws = [np.bincount(rng.integers(0, G, G), minlength=G).astype(np.float64) for _ in range(n_boot)]
    cells, seeds, curves, replicates = [], [], [], {}
    for m, x in per_seed.items():
        x = np.asarray(x, dtype=np.float64)
        # [n_s, n_c, G] unit sums: a replicate's curve is a weighted sum of them (NaN stays NaN where not served)
        sums = np.stack([[np.bincount(index, weights=np.nan_to_num(v), minlength=G) for v in xs] for xs in x])
        sums[np.isnan(x).all(-1)] = np.nan
        c_eff, best_c, censored = effective(sums.sum(-1) / n_g.sum(), contexts, fraction)
        reps = np.full(n_boot, np.nan)
        for b, w in enumerate(draws):
            value = effective(sums @ w / (n_g @ w), contexts, fraction)[0]
            reps[b] = value[rng.integers(0, len(value), len(value))].mean()  # the cell's seeds, resampled
        replicates[m] = reps
        q = (1 - level) / 2
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            low, high = np.nanquantile(reps, [q, 1 - q]) if n_boot else (np.nan, np.nan)
        means = sums.sum(-1) / n_g.sum()  # [n_s, n_c]
        cells.append(
            {
                "cell": m,
                "c_eff": c_eff.mean(),
                "low": low,
                "high": high,
                "censored": bool(censored.any()),
                "seeds": ", ".join(f"{'>=' if cs else ''}{v:g}" for v, cs in zip(c_eff, censored)),
                "best_c": ", ".join(f"{v:g}" for v in best_c),
                "n_seeds": len(x),
            }
        )
        seeds += [
            {
                "cell": m,
                "seed": s,
                "c_eff": c_eff[s],
                "censored": bool(censored[s]),
                "best_c": best_c[s],
                "best": np.nanmin(means[s]),
            }
            for s in range(len(x))
        ]
        best_k = [list(contexts).index(int(b)) if np.isfinite(b) else 0 for b in best_c]
        for k, c in enumerate(contexts):
            if np.isnan(x[:, k]).all():
                continue
            d = mean_interval(x[:, k] - x[np.arange(len(x)), best_k], units, level)
            curves.append(
                {
                    "cell": m,
                    "c": c,
                    "loss": means[:, k].mean(),
                    "gap": d.estimate,
                    "low": d.low,
                    "high": d.high,
                    "relative_gap": float((means[:, k] / np.nanmin(means, 1) - 1).mean()),
                }
            )
    return EffectiveContext(pd.DataFrame(cells), pd.DataFrame(seeds), pd.DataFrame(curves), replicates, fraction, level)


def gain_tokens(x: np.ndarray, contexts: Sequence[int], c_from: int, c_to: int) -> np.ndarray:
    """[n_seeds, n_tokens] each token's loss at ``c_to`` minus at ``c_from``, seed by seed (``x``: [n_seeds, n_c,
    n_tokens]): what the contexts between them change, negative where they help. ValueError naming a c not on
    the grid."""
    contexts = list(contexts)
    for c in (c_from, c_to):
        if c not in contexts:
            raise ValueError(f"c = {c} was not evaluated (the grid: {contexts}); extend ablate.analysis.context")
    return np.asarray(x[:, contexts.index(c_to)], np.float64) - np.asarray(x[:, contexts.index(c_from)], np.float64)
