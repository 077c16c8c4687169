"""Relative effective context length (RECL, Transformer-XL appendix C), estimated so that noise cannot
fake a gain. Pure numpy on per-token losses; no model here.

The paper's definition, for the models m of a group, per-token losses l_m(c, t) at context length c
(every scored token sees exactly c previous tokens) and c' = c + delta:

    b(c, t)     = min_m l_m(c, t)                                the group's best
    T_r         = the top r fraction of tokens by b(c, t)         the hard tokens
    f_m(c, c')  = mean_{t in T_r} min(b(c, t), l_m(c', t))
    g_m(c, c')  = (exp f_m(c, c) - exp f_m(c, c')) / exp f_m(c, c)
    RECL_m      = the first c with g_m(c, c') < threshold (0.01)

Two biases, and what is done instead.

- The baseline contains the model itself. min(b, l_m(c')) credits every token where l_m(c') happens to dip
  below l_m(c) (= b where m is best), so a model whose losses at c and c' are exchangeable still "gains",
  and a noisier model gains more. Here the baseline is leave-one-out: b_{-m}(c, t) = min over the OTHER
  models, and f_m(c, c) = mean min(b_{-m}(c, t), l_m(c, t)) is taken like f_m(c, c'). A model that gains
  nothing then gains nothing in expectation, and the hard tokens, chosen by b_{-m}, do not depend on m's
  own noise. The relative meaning stays: a far-worse model is capped by the others on every token and
  gains nothing from its own noise.
- "The first c below 1%" on a noisy curve stops early at the first dip. The gain curve is first fitted by a
  non-increasing function of c (isotonic regression: gains fall with context), then thresholded.

Uncertainty: a cluster bootstrap, documents resampled with replacement (the same documents for every
model: the baseline is recomputed on each replicate) and each cell's seeds resampled; percentile intervals
of RECL, gain curves with bands, and the paired difference of two cells' RECL on the same replicates.
With 3 seeds a cell the seed part of a bootstrap is too narrow (a bootstrap of three values): the report
says so.

What can resolve memory (issue 29): ``seed_gains`` (a gain curve per seed, so the noise level does not move
with the number of seeds), ``area_per_token`` (the area under the log-gain curve as per-token values per
seed, judged with ``stats.paired_difference`` over seeds and units), ``crossing`` / ``crossings`` (RECL as the
interpolated crossing of a fitted curve, descriptive) and ``interval_text`` (an interval narrower than the grid
step says so, never "+0 [+0, +0]").
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import isotonic_regression

from posenc_lab.tables import write_csv

R_VALUES = (0.1, 0.5, 1.0)
THRESHOLD = 0.01


def _stack(losses: dict[str, np.ndarray], contexts: Sequence[int]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(names, [n_m, n_c, n_t] losses, [n_m, n_c] served) or ValueError."""
    names = list(losses)
    if not names:
        raise ValueError("RECL needs at least one model")
    if list(contexts) != sorted(set(contexts)):
        raise ValueError(f"contexts must be strictly increasing, got {list(contexts)}")
    stack = np.stack([np.asarray(losses[m], dtype=np.float64) for m in names])
    if stack.ndim != 3 or stack.shape[1] != len(contexts):
        raise ValueError(
            f"each model's losses must be [len(contexts)={len(contexts)}, n_tokens]; got "
            + ", ".join(f"{m}: {np.shape(losses[m])}" for m in names)
        )
    nan = np.isnan(stack)
    partial = nan.any(2) & ~nan.all(2)
    if partial.any():
        m, k = np.argwhere(partial)[0]
        raise ValueError(f"model {names[m]} has NaN losses for some tokens at c = {contexts[k]} (all or none)")
    return names, stack, ~nan[:, :, 0]


def _hardest(b: np.ndarray, k: int) -> np.ndarray | slice:
    """The indices of the k largest entries of ``b`` [n], ties taken by the lower index (the first k of a stable
    descending sort, as a set); a partition, not a sort: the bootstrap asks this thousands of times."""
    n = len(b)
    if k >= n:
        return slice(None)  # every token, in order
    v = np.partition(b, n - k)[n - k]  # the k-th largest value
    above = np.flatnonzero(b > v)
    return np.concatenate([above, np.flatnonzero(b == v)[: k - len(above)]])


def gains(stack: np.ndarray, served: np.ndarray, pairs, r_values=R_VALUES) -> np.ndarray:
    """[n_pairs, n_r, n_m] leave-one-out gains g_m(c, c + delta); NaN where m cannot serve c or c', or
    where no other model serves c (one model alone has no baseline)."""
    n_m, _, n_t = stack.shape
    out = np.full((len(pairs), len(r_values), n_m), np.nan)
    for i, (k, k2) in enumerate(pairs):
        at_k = np.flatnonzero(served[:, k])
        if len(at_k) < 2:  # one model alone has no baseline
            continue
        # b_{-m}(c, t) for every m at once: the lowest loss of the served models, or the second lowest where m
        # is the lowest (ties: equal values, so the same minimum as over the others)
        low2 = np.partition(stack[at_k, k], 1, axis=0)[:2]
        lowest_model = at_k[stack[at_k, k].argmin(0)]
        for m in at_k:
            if not served[m, k2]:
                continue
            b = np.where(lowest_model == m, low2[1], low2[0])
            for j, r in enumerate(r_values):
                hard = _hardest(b, max(1, int(round(r * n_t))))
                f_cc = np.minimum(b[hard], stack[m, k, hard]).mean()
                f_cc2 = np.minimum(b[hard], stack[m, k2, hard]).mean()
                out[i, j, m] = 1.0 - np.exp(f_cc2 - f_cc)
    return out


def monotone(gain: np.ndarray) -> np.ndarray:
    """The non-increasing least-squares fit of each gain curve [n_pairs, ...] along its first axis; NaN
    entries (contexts not served) are left out of the fit and stay NaN."""
    out = np.full_like(gain, np.nan)
    flat, fit = gain.reshape(len(gain), -1), out.reshape(len(gain), -1)
    for col in range(flat.shape[1]):
        ok = np.isfinite(flat[:, col])
        if ok.any():
            fit[ok, col] = isotonic_regression(flat[ok, col], increasing=False).x
    return out


def first_below(curve: np.ndarray, served: np.ndarray, contexts, pairs, threshold: float):
    """(RECL [n_r, n_m], censored [n_r, n_m]): the first served c whose fitted gain is below the threshold;
    censored: none was, RECL is then the last c tested (the truth is larger). NaN: serves no pair."""
    c_of = np.array([contexts[k] for k, _ in pairs], dtype=np.float64)
    finite = np.isfinite(curve)
    stop = finite & (curve < threshold)
    any_stop, any_finite = stop.any(0), finite.any(0)
    first = np.where(any_stop, stop.argmax(0), -1)
    last = np.where(any_finite, len(pairs) - 1 - finite[::-1].argmax(0), -1)
    idx = np.where(any_stop, first, last)
    value = np.where(idx >= 0, c_of[np.clip(idx, 0, None)], np.nan)
    return value, ~any_stop & any_finite


def _pairs(contexts: Sequence[int], delta: int | None) -> list[tuple[int, int]]:
    contexts = list(contexts)
    if delta is None:
        steps = set(np.diff(contexts).tolist())
        if len(steps) != 1:
            raise ValueError(f"contexts {contexts} are not evenly spaced: pass delta explicitly")
        delta = steps.pop()
    index = {c: k for k, c in enumerate(contexts)}
    pairs = [(index[c], index[c + delta]) for c in contexts if c + delta in index]
    if not pairs:
        raise ValueError(f"no context c in {contexts} has c + delta = c + {delta} in the grid")
    return pairs


@dataclass
class ReclResult:
    """``table``: one row per (model, r): recl, censored, recl_low, recl_high, and the descriptive interpolated
    crossing (``crossing``) with its censoring and percentile interval; ``curves``: one row per
    (model, r, c): gain, fitted, band low/high; ``replicates``: [n_boot, n_r, n_m] RECL of each replicate
    (for paired differences); names, r_values: their axes."""

    table: pd.DataFrame
    curves: pd.DataFrame
    replicates: np.ndarray
    names: list[str]
    r_values: tuple[float, ...]
    # the smooth estimand: (cell with memory, cell without, c_max, Difference of the areas in nats), see areas()
    areas: list = field(default_factory=list)

    def difference(self, a: str, b: str, r: float, level: float = 0.95) -> tuple[float, float, float]:
        """RECL(a) - RECL(b) at r: the point value and the percentile interval of the same replicates."""
        j, ia, ib = self.r_values.index(r), self.names.index(a), self.names.index(b)
        point = self.table.set_index(["model", "r"]).loc
        est = float(point[(a, r), "recl"] - point[(b, r), "recl"])
        with warnings.catch_warnings():  # replicates where one side serves nothing are NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            lo, hi = np.nanquantile(
                self.replicates[:, j, ia] - self.replicates[:, j, ib], [(1 - level) / 2, (1 + level) / 2]
            )
        return est, float(lo), float(hi)


def _per_token(per_seed: dict[str, np.ndarray], seed_draw: dict[str, np.ndarray] | None, take) -> dict:
    """Cell losses [n_c, tokens] averaged over (drawn) seeds, at token positions ``take``."""
    out = {}
    for m, x in per_seed.items():
        seeds = x if seed_draw is None else x[seed_draw[m]]
        out[m] = seeds.mean(0)[:, take] if take is not None else seeds.mean(0)
    return out


def recl(
    per_seed: dict[str, np.ndarray],
    contexts: Sequence[int],
    documents: np.ndarray,
    *,
    delta: int | None = None,
    r_values: Sequence[float] = R_VALUES,
    threshold: float = THRESHOLD,
    n_boot: int = 200,
    level: float = 0.95,
    seed: int = 0,
) -> ReclResult:
    """RECL of every cell of a group (module docstring).

    per_seed: cell -> [n_seeds, n_c, n_tokens] per-token losses (nats), the same tokens for every cell and
    context (NaN over a whole [c] slice: the cell cannot serve c); documents: [n_tokens] ints; contexts:
    increasing, c + delta on the grid for the gain at c to exist (delta default: the grid step)."""
    r_values = tuple(r_values)
    pairs = _pairs(contexts, delta)
    names, stack, served = _stack(_per_token(per_seed, None, None), contexts)
    g = gains(stack, served, pairs, r_values)
    fitted = monotone(g)
    value, censored = first_below(fitted, served, contexts, pairs, threshold)
    rng = np.random.default_rng(seed)
    _, doc_index = np.unique(np.asarray(documents), return_inverse=True)
    members = [np.flatnonzero(doc_index == k) for k in range(doc_index.max() + 1)]
    reps, rep_fits = [], []
    for _ in range(n_boot):
        take = np.concatenate([members[k] for k in rng.integers(0, len(members), len(members))])
        draw = {m: rng.integers(0, len(x), len(x)) for m, x in per_seed.items()}
        _, s_stack, _ = _stack(_per_token(per_seed, draw, take), contexts)
        fit = monotone(gains(s_stack, served, pairs, r_values))
        rep_fits.append(fit)
        reps.append(first_below(fit, served, contexts, pairs, threshold)[0])
    if not reps:  # n_boot = 0: point values only
        reps, rep_fits = np.full((1, *value.shape), np.nan), np.full((1, *fitted.shape), np.nan)
    reps, rep_fits = np.stack(reps), np.stack(rep_fits)  # [B, n_r, n_m], [B, n_pairs, n_r, n_m]
    c_of = [contexts[k] for k, _ in pairs]
    cross = crossings(fitted, c_of, threshold)  # ([n_r, n_m], [n_r, n_m])
    rep_cross = np.stack([crossings(f, c_of, threshold)[0] for f in rep_fits])  # [B, n_r, n_m]
    a = (1 - level) / 2
    with warnings.catch_warnings():  # cells that serve nothing have only NaN replicates
        warnings.simplefilter("ignore", RuntimeWarning)
        lo = np.nanquantile(reps, a, axis=0, method="lower")
        hi = np.nanquantile(reps, 1 - a, axis=0, method="higher")
        band_lo, band_hi = np.nanquantile(rep_fits, [a, 1 - a], axis=0)
        cross_lo, cross_hi = np.nanquantile(rep_cross, [a, 1 - a], axis=0)
    rows = [
        {
            "model": m,
            "r": r,
            "recl": value[j, i],
            "censored": bool(censored[j, i]),
            "recl_low": lo[j, i],
            "recl_high": hi[j, i],
            "crossing": cross[0][j, i],
            "crossing_censored": bool(cross[1][j, i]),
            "crossing_low": cross_lo[j, i],
            "crossing_high": cross_hi[j, i],
            "level": level,
        }
        for i, m in enumerate(names)
        for j, r in enumerate(r_values)
    ]
    curves = [
        {
            "model": m,
            "r": r,
            "c": contexts[k],
            "gain": g[p, j, i],
            "fitted": fitted[p, j, i],
            "band_low": band_lo[p, j, i],
            "band_high": band_hi[p, j, i],
        }
        for p, (k, _) in enumerate(pairs)
        for i, m in enumerate(names)
        for j, r in enumerate(r_values)
    ]
    return ReclResult(pd.DataFrame(rows), pd.DataFrame(curves), reps, names, r_values)


def recl_text(value, censored: bool) -> str:
    """'128', '>256' (above the grid: the gain stayed above the threshold), 'n/a'."""
    if value is None or not np.isfinite(value):
        return "n/a"
    return f">{int(value)}" if censored else str(int(value))


def _seed_of(x: np.ndarray, s: int) -> np.ndarray:
    """Seed s of a cell [n_seeds, ...], cycling when it has fewer seeds."""
    return x[s % len(x)]


def seed_gains(per_seed: dict[str, np.ndarray], contexts, *, delta=None, r: float = 1.0) -> dict[str, np.ndarray]:
    """Gain curves of every seed, cell -> [n_seeds, n_pairs] leave-one-out gains g(c, c + delta) at ``r``: seed s
    of a cell against seed s of each other cell, so that every curve has the noise of one model whatever the
    number of seeds (``min`` is not linear: averaging seeds first lowers the noise, and moves the estimate).
    Shapes as ``recl``; NaN where the cell cannot serve c or c + delta."""
    pairs = _pairs(contexts, delta)
    most = max(len(x) for x in per_seed.values())
    out = {m: np.full((len(x), len(pairs)), np.nan) for m, x in per_seed.items()}
    for s in range(most):
        names, stack, served = _stack({m: _seed_of(x, s) for m, x in per_seed.items()}, contexts)
        g = gains(stack, served, pairs, (r,))[:, 0]  # [n_pairs, n_m]
        for i, m in enumerate(names):
            if s < len(per_seed[m]):
                out[m][s] = g[:, i]
    return out


def area_per_token(
    per_seed: dict[str, np.ndarray], contexts, *, delta=None, r: float = 1.0, c_max: int | None = None
) -> dict[str, np.ndarray]:
    """The smooth estimand of memory: for every seed and scored token, its share of the area under the
    leave-one-out log-gain curve up to ``c_max``, cell -> [n_seeds, n_tokens], so that the mean over tokens is
    (step / delta) sum_c (f(c, c) - f(c, c + delta)) over the grid (the area, in nats; about the sum of the gains
    over the increments, the same estimand at any grid step). Compare two cells with
    ``stats.paired_difference(area[a], area[b], units)``: seeds and units, no threshold, no grid step. NaN
    (a whole seed) where a cell cannot serve a pair up to c_max: pass the range both cells serve."""
    contexts = list(contexts)
    pairs = [(k, k2) for k, k2 in _pairs(contexts, delta) if c_max is None or contexts[k2] <= c_max]
    if not pairs:
        raise ValueError(f"no pair (c, c + delta) of {contexts} lies at or below c_max = {c_max}")
    # a grid finer than delta holds delta / step overlapping pairs per increment: weigh each by step / delta,
    # so that the area is the same estimand at any step
    weight = (contexts[1] - contexts[0]) / (contexts[pairs[0][1]] - contexts[pairs[0][0]]) if len(contexts) > 1 else 1
    most = max(len(x) for x in per_seed.values())
    out = {m: np.zeros((len(x), x.shape[-1])) for m, x in per_seed.items()}
    for s in range(most):
        names, stack, served = _stack({m: _seed_of(x, s) for m, x in per_seed.items()}, contexts)
        n_t = stack.shape[-1]
        for i, m in enumerate(names):
            if s >= len(per_seed[m]):
                continue
            for k, k2 in pairs:
                others = served[:, k].copy()
                others[i] = False
                if not (served[i, k] and served[i, k2] and others.any()):
                    out[m][s] = np.nan
                    break
                b = stack[others, k].min(0)
                hard = np.argsort(-b, kind="stable")[: max(1, int(round(r * n_t)))]
                h = np.minimum(b[hard], stack[i, k, hard]) - np.minimum(b[hard], stack[i, k2, hard])
                out[m][s, hard] += h * weight * n_t / len(hard)
    return out


def memory_areas(
    per_seed: dict[str, np.ndarray], contexts, units, pairs, served, level: float = 0.95, delta: int | None = None
) -> list:
    """For each (a, b) of ``pairs`` (a cell with memory, the same without): the difference of their areas under
    the log-gain curve (``area_per_token``, r = 1) up to the longest c both serve (``served``: cell -> the
    contexts it serves), judged by ``stats.paired_difference`` over seeds and ``units`` [tokens]. Returns
    [(a, b, c_max, Difference)]."""
    from .stats import paired_difference

    out = []
    for a, b in pairs:
        both = [c for c in contexts if c in served[a] and c in served[b]]
        if len(both) < 2 or max(both) - min(both) < (delta or both[1] - both[0]):
            continue  # no increment (c, c + delta) that both serve
        c_max = max(both)
        area = area_per_token(per_seed, contexts, delta=delta, c_max=c_max)
        out.append((a, b, c_max, paired_difference(area[a], area[b], units, level)))
    return out


def crossing(curve: np.ndarray, c: Sequence[float], threshold: float = THRESHOLD) -> tuple[float, bool]:
    """(c*, censored): where a fitted (non-increasing) gain curve [n_pairs] at contexts ``c`` first falls below
    ``threshold``, interpolated linearly between the grid points around it: a descriptive RECL with no grid
    step in it. censored: it never does (c* is then the last c). NaN if the curve has no finite point."""
    c, curve = np.asarray(c, float), np.asarray(curve, float)
    ok = np.isfinite(curve)
    c, curve = c[ok], curve[ok]
    if not len(c):
        return float("nan"), False
    below = np.flatnonzero(curve < threshold)
    if not len(below):
        return float(c[-1]), True
    i = int(below[0])
    if i == 0:
        return float(c[0]), False
    g0, g1 = curve[i - 1], curve[i]
    return float(c[i - 1] + (g0 - threshold) / (g0 - g1) * (c[i] - c[i - 1])), False


def crossings(curve: np.ndarray, c: Sequence[float], threshold: float = THRESHOLD) -> tuple[np.ndarray, np.ndarray]:
    """``crossing`` of every fitted curve [n_pairs, n_r, n_m] along its first axis: (c* [n_r, n_m], censored)."""
    flat = curve.reshape(len(curve), -1)
    out = [crossing(flat[:, col], c, threshold) for col in range(flat.shape[1])]
    shape = curve.shape[1:]
    return np.array([x for x, _ in out]).reshape(shape), np.array([y for _, y in out]).reshape(shape)


def interval_text(estimate: float, low: float, high: float, step: float) -> str:
    """A RECL difference with its interval, in tokens. An interval narrower than the grid step is not
    certainty but the grid's resolution, and says so: "+0 (within one step of 8 tokens)"."""
    if not all(np.isfinite(x) for x in (estimate, low, high)):
        return "n/a"
    if high - low < step:
        return f"{estimate:+.0f} (within one step of {step:g} tokens: the grid cannot resolve it)"
    return f"{estimate:+.0f} [{low:+.0f}, {high:+.0f}]"


def from_dumps(paths, n_boot: int = 200, level: float = 0.95, delta: int | None = None) -> ReclResult:
    """RECL of the cells of controlled-context dumps (``dumps.at_contexts`` files): one group, one grid."""
    from .dumps import read_dump, same_tokens  # the dumps' format is theirs; RECL itself is pure numpy

    loaded = {Path(p).stem: read_dump(Path(p)) for p in paths}
    if not loaded:
        raise ValueError("no per-token loss dumps to compute RECL from")
    corpora = {d.meta.get("corpus") for d in loaded.values()}
    if len(corpora) > 1:
        raise ValueError(f"a RECL group is one corpus; these dumps mix {sorted(map(str, corpora))}")
    grids = {tuple(d.contexts) for d in loaded.values()}
    if len(grids) > 1:
        raise ValueError(f"the dumps have different context grids {sorted(grids)}: dump the group with one grid")
    documents = same_tokens(loaded)
    cells: dict[str, list] = {}
    for d in loaded.values():
        cells.setdefault(d.meta["cell"], []).append(d.loss[:, d.scored])
    contexts = list(next(iter(grids)))
    # the grid: the most common spacing (a run's own attention length may sit between its points)
    diffs, counts = np.unique(np.diff(contexts), return_counts=True)
    step = int(diffs[counts.argmax()])
    grid = [c for c in contexts if (c - contexts[-1]) % step == 0]
    k = [contexts.index(c) for c in grid]
    per_seed = {c: np.stack(v)[:, k] for c, v in cells.items()}
    return recl(per_seed, grid, documents, delta=delta or step, n_boot=n_boot, level=level)


def main(argv=None) -> int:
    """python -m posenc_lab_analysis.recl DUMP_DIR --out DIR: RECL of a folder of controlled-context dumps (a
    report's dumps/contexts/), without loading any model."""
    p = argparse.ArgumentParser(prog="python -m posenc_lab_analysis.recl", description=main.__doc__)
    p.add_argument("dumps", type=Path, help="a folder of <run>.npz controlled-context dumps")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--n-boot", type=int, default=200)
    a = p.parse_args(argv)
    try:
        res = from_dumps(sorted(a.dumps.glob("*.npz")), n_boot=a.n_boot)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_csv(res.table, a.out / "recl.csv")
    write_csv(res.curves, a.out / "recl_curves.csv")
    print(res.table.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
