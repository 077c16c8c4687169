"""Relative effective context length (RECL, Transformer-XL appendix C), estimated so that noise cannot
fake a gain. Pure numpy on per-token losses; no model here.

The paper's definition, for the models m of a group, per-token losses l_m(c, t) at context length c
(every scored token sees exactly c previous tokens) and c' = c + delta:

    b(c, t)     = min_m l_m(c, t)                                the group's best
    T_r         = the top r fraction of tokens by b(c, t)         the hard tokens
    f_m(c, c')  = mean_{t in T_r} min(b(c, t), l_m(c', t))
    g_m(c, c')  = (exp f_m(c, c) - exp f_m(c, c')) / exp f_m(c, c)
    RECL_m      = the first c with g_m(c, c') < threshold (the paper's 1%: ablate.analysis.recl.threshold)

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

Per seed: each run's gain curve is taken against the other cells' first seeds (``reference``), so a
seed's RECL does not change when a seed is added to any cell; a cell's RECL is the mean of its seeds'.
Uncertainty: a cluster bootstrap, units resampled with replacement (the same for every cell) and each cell's
seeds resampled; percentile intervals. With 3 seeds a cell the seed part is a bootstrap of three values, too
narrow: the report says so. ``area_per_token``: the smooth estimand (the capped log-loss drop along the grid,
past L too), judged with ``stats.paired_difference``; ``crossing``: RECL read between grid points
(descriptive); ``interval_text``: an interval narrower than the grid step says so.
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


def monotone(gain: np.ndarray) -> np.ndarray:
    """The non-increasing least-squares fit of each gain curve [n_pairs, ...] along its first axis; NaN
    entries (contexts not served) are left out of the fit and stay NaN."""
    out = np.full(gain.shape, np.nan)  # C-ordered, so that the reshape below is a view
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
    """``table``: one row per (model, r): recl (the mean of its seeds' RECL), censored (a seed's curve stayed above
    the threshold: a lower bound), recl_low, recl_high, ``seeds`` (each seed's RECL), and the descriptive
    interpolated crossing (``crossing``, the mean of its seeds') with its censoring and percentile interval;
    ``per_seed``: one row per (model, seed, r); ``curves``: one row per (model, r, c): gain, fitted (means over
    seeds), band low/high; ``replicates``: [n_boot, n_r, n_m] RECL of each replicate (for paired differences);
    names, r_values: their axes."""

    table: pd.DataFrame
    curves: pd.DataFrame
    replicates: np.ndarray
    names: list[str]
    r_values: tuple[float, ...]
    # the smooth estimand: (cell with memory, cell without, c_max, Difference of the areas in nats), see areas()
    areas: list = field(default_factory=list)
    per_seed: pd.DataFrame = field(default_factory=pd.DataFrame)

    def difference(self, a: str, b: str, r: float, level: float) -> tuple[float, float, float]:
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


def reference(per_seed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model each cell puts in the others' baseline: its first seed. Fixed, so that a seed's RECL and area
    do not change when a seed is added to any cell (a mean over seeds would lower the baseline's noise and move
    every other cell's value: ``min`` is not linear)."""
    return {m: np.asarray(x[0], dtype=np.float64) for m, x in per_seed.items()}


def seed_gains(per_seed, names, ref, served, pairs, r_values, take=None) -> dict[str, np.ndarray]:
    """cell -> [n_seeds, n_pairs, n_r] leave-one-out gains of each of its seeds against the other cells' reference
    models (``reference``), on the tokens ``take`` (None: all); NaN where the cell cannot serve c or c + delta or
    no other cell serves c."""
    ref = ref if take is None else ref[:, :, take]
    n_t = ref.shape[-1]
    out = {}
    for i, m in enumerate(names):
        x = np.asarray(per_seed[m], dtype=np.float64)
        x = x if take is None else x[:, :, take]
        g = np.full((len(x), len(pairs), len(r_values)), np.nan)
        for p, (k, k2) in enumerate(pairs):
            others = served[:, k].copy()
            others[i] = False
            if not (others.any() and served[i, k] and served[i, k2]):
                continue
            b = ref[others, k].min(0)  # b_{-m}(c, t): the other cells' best
            for j, r in enumerate(r_values):
                hard = _hardest(b, max(1, int(round(r * n_t))))
                f_cc = np.minimum(b[hard], x[:, k, hard]).mean(-1)
                g[:, p, j] = 1.0 - np.exp(np.minimum(b[hard], x[:, k2, hard]).mean(-1) - f_cc)
        out[m] = g
    return out


def _per_seed_recl(gain: dict, contexts, pairs, threshold) -> dict[str, tuple]:
    """cell -> (fitted [n_pairs, n_r, n_s], RECL [n_r, n_s], censored [n_r, n_s], crossing, crossing censored)."""
    c_of = [contexts[k] for k, _ in pairs]
    out = {}
    for m, g in gain.items():
        fit = monotone(np.moveaxis(g, 0, -1))  # [n_pairs, n_r, n_s]
        value, censored = first_below(fit, None, contexts, pairs, threshold)
        out[m] = (fit, value, censored, *crossings(fit, c_of, threshold))
    return out


def recl(
    per_seed: dict[str, np.ndarray],
    contexts: Sequence[int],
    documents: np.ndarray,
    *,
    delta: int | None = None,
    r_values: Sequence[float],
    threshold: float,
    n_boot: int,
    level: float,
    seed: int = 0,
) -> ReclResult:
    """RECL of every seed of every cell of a group (module docstring), and of each cell: the mean of its seeds'.

    per_seed: cell -> [n_seeds, n_c, n_tokens] per-token losses (nats), the same tokens for every cell and
    context (NaN over a whole [c] slice: the cell cannot serve c); documents: [n_tokens] the units; contexts:
    increasing, c + delta on the grid for the gain at c to exist (delta default: the grid step). A seed's RECL is
    its gain curve against the other cells' first seeds (``reference``): it does not depend on how many seeds any
    cell has. Intervals: a cluster bootstrap over the units and each cell's seeds."""
    r_values = tuple(r_values)
    pairs = _pairs(contexts, delta)
    _stack({f"{m} (seed {s})": x for m, xs in per_seed.items() for s, x in enumerate(np.asarray(xs))}, contexts)
    names, ref, served = _stack(reference(per_seed), contexts)
    raw = seed_gains(per_seed, names, ref, served, pairs, r_values)
    point = _per_seed_recl(raw, contexts, pairs, threshold)
    rng = np.random.default_rng(seed)
    _, doc_index = np.unique(np.asarray(documents), return_inverse=True)
    members = [np.flatnonzero(doc_index == k) for k in range(doc_index.max() + 1)]
    n_m, n_r, n_p = len(names), len(r_values), len(pairs)
    reps, rep_cross = np.full((n_boot, n_r, n_m), np.nan), np.full((n_boot, n_r, n_m), np.nan)
    rep_fits = np.full((n_boot, n_p, n_r, n_m), np.nan)
    with warnings.catch_warnings():  # cells that serve nothing have only NaN values
        warnings.simplefilter("ignore", RuntimeWarning)
        for b in range(n_boot):
            take = np.concatenate([members[k] for k in rng.integers(0, len(members), len(members))])
            found = _per_seed_recl(
                seed_gains(per_seed, names, ref, served, pairs, r_values, take), contexts, pairs, threshold
            )
            for i, m in enumerate(names):
                fit, value, _, cross, _ = found[m]
                draw = rng.integers(0, value.shape[-1], value.shape[-1])  # the cell's seeds, resampled
                reps[b, :, i] = value[:, draw].mean(-1)
                rep_fits[b, :, :, i] = fit[:, :, draw].mean(-1)
                rep_cross[b, :, i] = cross[:, draw].mean(-1)
        if not n_boot:  # point values only: NaN intervals
            reps, rep_cross, rep_fits = np.full((1, n_r, n_m), np.nan), np.full((1, n_r, n_m), np.nan), rep_fits[:1]
            rep_fits = np.full((1, n_p, n_r, n_m), np.nan)
        a = (1 - level) / 2
        lo, hi = np.nanquantile(reps, [a, 1 - a], axis=0)
        band_lo, band_hi = np.nanquantile(rep_fits, [a, 1 - a], axis=0)
        cross_lo, cross_hi = np.nanquantile(rep_cross, [a, 1 - a], axis=0)
    rows, seeds, curves = [], [], []
    for i, m in enumerate(names):
        fit, value, censored, cross, cross_censored = point[m]
        for j, r in enumerate(r_values):
            rows.append(
                {
                    "model": m,
                    "r": r,
                    "recl": value[j].mean(),
                    "censored": bool(censored[j].any()),
                    "recl_low": lo[j, i],
                    "recl_high": hi[j, i],
                    "seeds": ", ".join(recl_text(v, bool(cs)) for v, cs in zip(value[j], censored[j])),
                    "crossing": cross[j].mean(),
                    "crossing_censored": bool(cross_censored[j].any()),
                    "crossing_low": cross_lo[j, i],
                    "crossing_high": cross_hi[j, i],
                    "level": level,
                }
            )
            seeds += [
                {
                    "model": m,
                    "seed": s,
                    "r": r,
                    "recl": value[j, s],
                    "censored": bool(censored[j, s]),
                    "crossing": cross[j, s],
                }
                for s in range(value.shape[-1])
            ]
            curves += [
                {
                    "model": m,
                    "r": r,
                    "c": contexts[k],
                    "c_next": contexts[k2],
                    "gain": np.nanmean(raw[m][:, p, j]) if np.isfinite(raw[m][:, p, j]).any() else np.nan,
                    "fitted": fit[p, j].mean(),
                    "band_low": band_lo[p, j, i],
                    "band_high": band_hi[p, j, i],
                }
                for p, (k, k2) in enumerate(pairs)
            ]
    return ReclResult(pd.DataFrame(rows), pd.DataFrame(curves), reps, names, r_values, per_seed=pd.DataFrame(seeds))


def recl_text(value, censored: bool) -> str:
    """'128', '13.3' (a mean over seeds), '>256' (above the grid: the gain stayed above the threshold), 'n/a'."""
    if value is None or not np.isfinite(value):
        return "n/a"
    return (">" if censored else "") + f"{round(float(value), 1):g}"


def area_per_token(
    per_seed: dict[str, np.ndarray], contexts, *, r: float = 1.0, c_max: int | None = None
) -> dict[str, np.ndarray]:
    """The smooth estimand of a cell's use of context: for every seed and scored token, its share of the capped
    log-loss drop along the grid up to ``c_max``, cell -> [n_seeds, n_tokens], so that the mean over tokens is
    sum_k f(c_k, c_k) - f(c_k, c_k+1) over consecutive grid points (nats: the sum of the leave-one-out log-gains,
    the improvement from the first c to c_max as the other cells' best caps it; the same estimand at any grid
    step, coarse past 2 L or not). The baseline: the other cells' first seeds (``reference``), so a seed's area
    does not move when seeds are added. Compare two cells with ``stats.paired_difference(area[a], area[b],
    units)``: seeds and units, no threshold. NaN (a whole seed) where a cell cannot serve a point up to c_max: pass
    the range both cells serve."""
    contexts = list(contexts)
    pairs = [(k, k + 1) for k in range(len(contexts) - 1) if c_max is None or contexts[k + 1] <= c_max]
    if not pairs:
        raise ValueError(f"no two contexts of {contexts} lie at or below c_max = {c_max}")
    names, ref, served = _stack(reference(per_seed), contexts)
    n_t = ref.shape[-1]
    out = {m: np.zeros((len(x), n_t)) for m, x in per_seed.items()}
    for i, m in enumerate(names):
        x = np.asarray(per_seed[m], dtype=np.float64)
        for k, k2 in pairs:
            others = served[:, k].copy()
            others[i] = False
            if not (served[i, k] and served[i, k2] and others.any()):
                out[m][:] = np.nan
                break
            b = ref[others, k].min(0)
            hard = np.argsort(-b, kind="stable")[: max(1, int(round(r * n_t)))]
            h = np.minimum(b[hard], x[:, k, hard]) - np.minimum(b[hard], x[:, k2, hard])
            out[m][:, hard] += h * n_t / len(hard)
    return out


def memory_areas(per_seed: dict[str, np.ndarray], contexts, units, pairs, served, level: float) -> list:
    """For each (a, b) of ``pairs`` (a cell with memory, the same without): the difference of their areas
    (``area_per_token``, r = 1) up to the longest c both serve (``served``: cell -> the contexts it serves), judged
    by ``stats.paired_difference`` over seeds and ``units`` [tokens]. Returns [(a, b, c_max, Difference)]."""
    from .stats import paired_difference

    out = []
    for a, b in pairs:
        both = [c for c in contexts if c in served[a] and c in served[b]]
        if len(both) < 2:
            continue  # no increment that both serve
        c_max = max(both)
        area = area_per_token(per_seed, contexts, c_max=c_max)
        out.append((a, b, c_max, paired_difference(area[a], area[b], units, level)))
    return out


def crossing(curve: np.ndarray, c: Sequence[float], threshold: float) -> tuple[float, bool]:
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


def crossings(curve: np.ndarray, c: Sequence[float], threshold: float) -> tuple[np.ndarray, np.ndarray]:
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


def from_dumps(paths, n_boot: int, level: float, r_values, threshold: float, delta: int | None = None) -> ReclResult:
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
    # delta: the most common spacing of the grid (a run's own attention length may sit between its points)
    diffs, counts = np.unique(np.diff(contexts), return_counts=True)
    per_seed = {c: np.stack(v) for c, v in cells.items()}
    delta = delta or int(diffs[counts.argmax()])
    return recl(
        per_seed, contexts, documents, delta=delta, r_values=r_values, threshold=threshold, n_boot=n_boot, level=level
    )


def main(argv=None) -> int:
    """python -m posenc_lab_analysis.recl DUMP_DIR --out DIR: RECL of a folder of controlled-context dumps (a
    report's dumps/contexts/), without loading any model."""
    p = argparse.ArgumentParser(prog="python -m posenc_lab_analysis.recl", description=main.__doc__)
    p.add_argument("dumps", type=Path, help="a folder of <run>.npz controlled-context dumps")
    p.add_argument("--out", required=True, type=Path)
    from .settings import conf_block

    conf = conf_block()  # the defaults: ablate.analysis of conf/ablate.yaml
    p.add_argument("--n-boot", type=int, default=conf["context"]["n_boot"])
    p.add_argument("--level", type=float, default=conf["level"], help="the intervals' confidence level")
    a = p.parse_args(argv)
    if not 0 < a.level < 1:
        print(f"error: --level must be a confidence level in (0, 1), got {a.level}", file=sys.stderr)
        return 2
    try:
        paths, recl_conf = sorted(a.dumps.glob("*.npz")), conf["recl"]
        res = from_dumps(paths, a.n_boot, a.level, recl_conf["r_values"], recl_conf["threshold"])
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_csv(res.table, a.out / "recl.csv")
    write_csv(res.curves, a.out / "recl_curves.csv")
    print(res.table.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
