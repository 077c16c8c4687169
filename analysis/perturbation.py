"""What the far context is worth to a model, shown and not inferred: each scored token's loss with its true
context and with the context beyond distance d replaced by text of another unit of the split (Sun et al. 2021,
"Do Long-Range Language Models Actually Use Long-Range Context?"; Khandelwal et al. 2018, "Sharp Nearby, Fuzzy
Far Away"), and the long-range tokens, a subset of the test tokens fixed in advance that only far context can
predict.

The evaluation (``perturbed``). Rows of H + S inputs lie evenly over the split (``context.stream_rows``); each
is run as trained (its segments and memory: ``context.perturbed_losses``, the ``Recurrence`` step) as one episode
from offset 0 and an empty memory, with no reset inside it, as the paper evaluates (training episodes shorter than
the row would cut every context at the block's offset in its episode; a scheme that reads stream offsets,
``global_sinusoid``, then meets offsets past its training episodes, and ``Perturbed.offsets_note`` says so). Its
last S inputs, H..H + S - 1, are scored: S whole segments of every run (the least common multiple of their
segment lengths: L itself where they share it), H a multiple of S of at least the largest d plus L + M, so that
the memory is full at every d. Row r's replacement text is row r' of the split, the first row half the split
away (or further) that shares no unit with it: positions are unchanged, and for a memory cell the memory of the
scored block is built from the replaced text. The scored input at block position k keeps its d + k + 1 nearest
inputs true; use(d) = perturbed - true, paired by token, is what the context beyond at least d tokens is worth.
d = 0 replaces all that precedes the block: the whole memory from another unit. Cost per run: (1 + len(distances))
x n_rows ordered passes over H + S tokens, run as one batch of streams.

The statistics (``use_table``): use(d) of a cell is the mean over its seeds and scored tokens with the interval
of ``stats.mean_interval`` (seeds and the text's units); per seed the same over the text alone. The **context
used** is the largest d of the grid whose use(d) has its interval's lower end above 0 (per seed, and for the
cell, with a percentile interval of a cluster bootstrap over units and seeds); "none" where even use(0) is not.
Descriptive: no correction over the d of the grid.

The long-range tokens (``long_range``): a scored target whose n preceding inputs and itself (an (n + 1)-gram)
occur earlier in the same document with the target at a distance in (L + M, 4 (L + M)] and nowhere within the
last L + M: copying is possible from far context only. Fixed by the text, L and M before any model is read.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from numpy.lib.stride_tricks import sliding_window_view

from posenc_lab.context import perturbed_losses, reads_offsets, stream_rows
from posenc_lab.io import CorruptFileError, load_npz, save_npz

from .dumps import UNITS, _fingerprint, _side
from .runs import Run, RunError
from .stats import mean_interval, sums_interval

NGRAM = 8  # the long-range tokens: the target and its preceding NGRAM inputs repeat from far back


@dataclass
class PerturbationSettings:
    """``ablate.analysis.context_use``: ``n_rows`` scored rows (a block of whole segments each); ``distances``
    the d of use(d) (None: 0, the powers of 2 from 2, and L, L + M, 2 (L + M), 3 (L + M), 4 (L + M)); ``ngram``:
    the long-range tokens' n; ``batch_tokens``: tokens run at once (memory, not the result)."""

    n_rows: int
    distances: list[int] | None
    ngram: int
    batch_tokens: int

    def __post_init__(self):
        if self.n_rows < 2:
            raise ValueError(f"ablate.analysis.context_use.n_rows must be >= 2 (rows of two units), got {self.n_rows}")
        if self.distances is not None and (not self.distances or min(self.distances) < 0):
            raise ValueError(
                f"ablate.analysis.context_use.distances must be null or non-negative integers, got {self.distances}"
            )
        if self.ngram < 1:
            raise ValueError(f"ablate.analysis.context_use.ngram must be >= 1, got {self.ngram}")

    def grid(self, L: int, M: int) -> list[int]:
        """The distances d (module docstring)."""
        if self.distances is not None:
            return sorted({int(d) for d in self.distances})
        span = L + M
        powers = {2**i for i in range(1, 32) if 2**i <= 4 * span}
        return sorted({0, L, *powers, *(k * span for k in (1, 2, 3, 4))})


@dataclass(frozen=True)
class PerturbSpec:
    """One evaluation: the split, the rows, the distances, the scored block's start H and length S."""

    split: str
    n_rows: int
    distances: tuple[int, ...]
    history: int  # H: inputs before the scored block
    block: int  # S: the scored inputs, whole segments of every run
    batch_tokens: int


def spec(s: PerturbationSettings, runs: list[Run], split: str) -> PerturbSpec:
    """The evaluation of a group: L and M its longest; the scored block the least common multiple of the runs'
    segments (whole segments of every run: a window of the same span trained at segment L + M beside L), H the
    first multiple of it from max(d) + L + M."""
    L, M = max(r.segment_len for r in runs), max(r.mem_len for r in runs)
    block = math.lcm(*{r.segment_len for r in runs})
    distances = s.grid(L, M)
    need = max(distances) + L + M
    return PerturbSpec(split, s.n_rows, tuple(distances), -(-need // block) * block, block, s.batch_tokens)


@dataclass
class Perturbed:
    """One run's perturbed evaluation: ``true`` [rows, S], ``perturbed`` [n_d, rows, S] (nats); ``targets``
    [rows, S] the split positions of the scored targets; documents, units, scored: [rows, S]."""

    true: np.ndarray
    perturbed: np.ndarray
    targets: np.ndarray
    documents: np.ndarray
    units: np.ndarray
    scored: np.ndarray
    distances: list[int]
    meta: dict
    offsets_note: str = ""  # why the rows pass what the scheme saw in training (empty: they do not)

    def use(self) -> np.ndarray:
        """[n_d, tokens] perturbed minus true loss of the scored tokens (row by row)."""
        return (self.perturbed - self.true[None])[:, self.scored]


def partners(units: np.ndarray) -> np.ndarray:
    """[rows] for each row (``units`` [rows, n]: the unit of every token), the row whose text replaces its far
    context: the first from half the rows on (cyclically) that shares no unit with it; RunError if some row has
    none (the split holds too few units for the rows)."""
    n = len(units)
    sets = [set(np.unique(u).tolist()) for u in units]
    out = np.empty(n, dtype=np.int64)
    for r in range(n):
        for k in range(n // 2, n // 2 + n - 1):
            other = (r + k) % n
            if other != r and not sets[r] & sets[other]:
                out[r] = other
                break
        else:
            raise RunError(
                f"row {r} of the perturbed evaluation shares a unit with every other row: the split has too few units "
                f"for {n} rows of {units.shape[1]} tokens; use fewer rows (ablate.analysis.context_use.n_rows)"
            )
    return out


def perturbed(run: Run, s: PerturbSpec, path, log=print) -> Perturbed:
    """The run's perturbed evaluation (module docstring), kept at ``path`` (recomputed for other settings)."""
    meta = {**_fingerprint(run), "kind": "perturbed", "units": UNITS, **asdict(s), "distances": list(s.distances)}
    if path.is_file():
        try:
            d = read_perturbed(path)
            if d.meta == meta:
                return d
        except (RunError, CorruptFileError) as e:
            log(f"  {path} cannot be read ({e}); computing it again")
    data, side = run.split(s.split)
    width = s.history + s.block
    rows = stream_rows(data, s.n_rows, width)
    stride = (len(data) - 1) // s.n_rows
    starts = np.arange(s.n_rows) * stride
    corpus = run.corpus()
    units_all = corpus.families(s.split)
    row_units = units_all[starts[:, None] + np.arange(width + 1)]
    other = partners(row_units)
    targets = starts[:, None] + s.history + 1 + np.arange(s.block)
    true, pert = perturbed_losses(
        run.model(),
        rows,
        rows[other],
        s.distances,
        score_start=s.history,
        segment_len=run.segment_len,
        mem_len=run.mem_len,
        episode_len=None,
        batch_tokens=s.batch_tokens,
    )
    T = run.episode_len
    note = (
        f"reads stream offsets and was trained on episodes of {T}: the rows of {width} reach offsets it never saw"
        if T and width > T and reads_offsets(run.model())
        else ""
    )
    d = Perturbed(
        true.numpy(),
        np.stack([pert[k].numpy() for k in s.distances]),
        targets,
        corpus.documents(s.split)[targets],
        units_all[targets],
        _side(side, "loss_mask", targets, True).astype(bool),
        list(s.distances),
        meta,
        note,
    )
    save_npz(
        path,
        true=d.true.astype(np.float32),
        perturbed=d.perturbed.astype(np.float32),
        targets=d.targets,
        documents=d.documents,
        units=d.units,
        scored=d.scored,
        distances=np.array(d.distances),
        meta=json.dumps(meta),
        offsets_note=note,
    )
    return d


def read_perturbed(path) -> Perturbed:
    z = load_npz(path, remedy="delete it; the next analysis of its run computes it again")
    if missing := {"true", "perturbed", "targets", "documents", "units", "scored", "distances", "meta"} - set(z):
        raise RunError(f"{path} is not a perturbed-context dump (it lacks {sorted(missing)}); delete it")
    return Perturbed(
        z["true"],
        z["perturbed"],
        z["targets"],
        z["documents"],
        z["units"],
        z["scored"].astype(bool),
        z["distances"].tolist(),
        json.loads(str(z["meta"])),
        str(z.get("offsets_note", "")),
    )


def long_range(data: np.ndarray, documents: np.ndarray, targets: np.ndarray, span: int, n: int = NGRAM) -> np.ndarray:
    """[targets.shape] bool: whether the target at each split position of ``targets`` and its ``n`` preceding
    tokens occur earlier in its document (``documents`` [N]: of every token of ``data`` [N]) with the target at a
    distance in (span, 4 span] and at none within span (module docstring)."""
    data, documents = np.asarray(data), np.asarray(documents)
    flat = np.asarray(targets).reshape(-1)
    out = np.zeros(flat.shape, dtype=bool)
    grams = sliding_window_view(data, n + 1)  # grams[j - n]: the tokens j - n..j
    far = 4 * span
    for i, t in enumerate(flat):
        if t < n:
            continue
        lo = max(n, t - far)
        j = np.arange(lo, t)  # earlier targets at distance 1..4 span
        same = (grams[j - n] == grams[t - n]).all(1) & (documents[j - n] == documents[t])
        dist = t - j[same]
        out[i] = bool((dist > span).any() and not (dist <= span).any())
    return out.reshape(np.shape(targets))


def context_used(sums: np.ndarray, n_g: np.ndarray, distances: list[int], level: float) -> int | None:
    """The largest d whose use(d) interval lies above 0 (``stats.sums_interval`` of the unit sums ``sums``
    [n_seeds, n_d, G] of use, ``n_g`` [G] the units' tokens: ``mean_interval`` of the tokens); None where none
    does."""
    for k in reversed(range(len(distances))):
        if sums_interval(sums[:, k], n_g, level).low > 0:
            return distances[k]
    return None


def used_interval(
    sums: np.ndarray, n_g: np.ndarray, distances: list[int], level: float, n_boot: int, seed: int = 0
) -> tuple[int | None, int | None]:
    """A percentile interval of ``context_used`` over a cluster bootstrap: the units drawn with replacement (each
    draw a unit of its own) and the seeds with them; None as an end: "none" (not even d = 0 above zero)."""
    rng = np.random.default_rng(seed)
    n_s, G = sums.shape[0], sums.shape[2]
    values = []
    for _ in range(n_boot):
        pick, seeds = rng.integers(0, G, G), rng.integers(0, n_s, n_s)
        v = context_used(sums[seeds][:, :, pick], n_g[pick], distances, level)
        values.append(-1 if v is None else v)
    if not values:
        return None, None
    q = (1 - level) / 2
    low, high = np.quantile(values, q, method="lower"), np.quantile(values, 1 - q, method="higher")
    return (None if low < 0 else int(low)), (None if high < 0 else int(high))


def use_table(
    uses: dict[str, np.ndarray],
    distances: list[int],
    units: np.ndarray,
    level: float,
    seeds: dict[str, list],
    n_boot: int = 200,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(curves: a row per (cell, d): use with its interval, and per seed; used: a row per cell: the context used
    for the cell with its bootstrap interval (``used_interval``, ``n_boot`` replicates) and per seed). ``uses``:
    cell -> [n_seeds, n_d, tokens] perturbed minus true (nats), the same tokens for every cell; ``units``
    [tokens]; ``seeds``: cell -> its seeds' numbers."""
    _, index = np.unique(np.asarray(units), return_inverse=True)
    G = int(index.max()) + 1
    n_g = np.bincount(index, minlength=G).astype(np.float64)
    curves, used = [], []
    for cell, x in uses.items():
        x = np.asarray(x, dtype=np.float64)
        sums = np.stack([[np.bincount(index, weights=v, minlength=G) for v in xs] for xs in x])  # [n_s, n_d, G]
        for k, d in enumerate(distances):
            cell_i = mean_interval(x[:, k], units, level)
            row = {"cell": cell, "d": d, "use": cell_i.estimate, "low": cell_i.low, "high": cell_i.high}
            for s in range(len(x)):
                row[f"use_seed{seeds[cell][s]}"] = float(x[s, k].mean())
            curves.append(row)
        low, high = used_interval(sums, n_g, distances, level, n_boot)
        per_seed = [context_used(sums[s : s + 1], n_g, distances, level) for s in range(len(x))]
        used.append(
            {
                "cell": cell,
                "seeds": len(x),
                "context_used": context_used(sums, n_g, distances, level),
                "used_low": low,
                "used_high": high,
                "context_used_per_seed": ", ".join("none" if v is None else str(v) for v in per_seed),
            }
        )
    return pd.DataFrame(curves), pd.DataFrame(used)
