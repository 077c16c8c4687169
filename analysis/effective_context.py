"""Effective context length: relative effective context length (RECL, Transformer-XL appendix C)
of a group of models, and on the ``recall`` probe the answer accuracy by distance.

RECL, exactly as in shared/SCHEMES.md. For models m of one group, per-token losses
``l_m(c, t)`` at context length c (every scored token sees exactly c previous tokens):

    b(c, t)     = min_m l_m(c, t)                                  the group's best
    T_r         = the top r fraction of tokens t by b(c, t)         the hard tokens
    f_m(c, c')  = mean_{t in T_r} min(b(c, t), l_m(c', t))
    g_m(c, c')  = (exp f_m(c, c) - exp f_m(c, c')) / exp f_m(c, c),  c' = c + delta
    RECL_m      = the first c where g_m(c, c + delta) < threshold (0.01)

The losses come from ``posenc_lab.context.context_losses``: models trained with memory are run with
memory M' = c and the same-length mask; models trained without memory with a sliding window of c
tokens. They are dumped per run (``context_losses/<run>.npz``) and RECL is computed from the dumps.

    python -m posenc_lab_analysis.effective_context RUN_OR_FOLDER... --out DIR [--delta 32 --c-max 256]
    python -m posenc_lab_analysis.effective_context --from-dumps DIR/context_losses --out DIR
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from posenc_lab.tables import write_csv

from . import plots
from .runs import Run, RunError, add_threads_argument, apply_threads, cell_name, find_runs, one_corpus

R_VALUES = (0.1, 0.5, 1.0)
THRESHOLD = 0.01


# ---- RECL on per-token loss arrays (pure) --------------------------------------------------------


def _check(losses: dict[str, np.ndarray], contexts: Sequence[int], delta: int | None):
    """(names, stack [n_m, n_c, n_t], available [n_m, n_c], pairs [(k, k2)], contexts) or ValueError."""
    contexts = [int(c) for c in contexts]
    if not losses:
        raise ValueError("RECL needs at least one model")
    if sorted(set(contexts)) != contexts:
        raise ValueError(f"contexts must be strictly increasing, got {contexts}")
    if delta is None:
        steps = set(np.diff(contexts).tolist())
        if len(steps) != 1:
            raise ValueError(f"contexts {contexts} are not evenly spaced: pass delta explicitly")
        delta = steps.pop()
    index = {c: k for k, c in enumerate(contexts)}
    pairs = [(index[c], index[c + delta]) for c in contexts if c + delta in index]
    if not pairs:
        raise ValueError(f"no context c in {contexts} has c + delta = c + {delta} in the grid")
    names = list(losses)
    stack = np.stack([np.asarray(losses[m], dtype=np.float64) for m in names])  # [n_m, n_c, n_t]
    if stack.ndim != 3 or stack.shape[1] != len(contexts):
        raise ValueError(
            f"each model's losses must be [len(contexts)={len(contexts)}, n_tokens]; got "
            + ", ".join(f"{m}: {np.shape(losses[m])}" for m in names)
        )
    if np.isinf(stack).any():
        raise ValueError("per-token losses contain inf")
    # NaN = the model cannot serve that context length at all (e.g. a learned table too short):
    # a whole row [m, c, :] must then be NaN.
    na = np.isnan(stack)
    partial = na.any(axis=2) & ~na.all(axis=2)
    if partial.any():
        m, k = np.argwhere(partial)[0]
        raise ValueError(f"model {names[m]} has NaN losses for some tokens at c = {contexts[k]}")
    return names, stack, ~na[:, :, 0], pairs, contexts


def _gains(stack: np.ndarray, available: np.ndarray, pairs, r_values) -> tuple[np.ndarray, np.ndarray]:
    """(paper gain g_m(c, c + delta), own gain) [n_pairs, n_r, n_m]; NaN where m cannot serve c or c'.

    own gain = 1 - exp(mean_{S_r} l_m(c') - mean_{S_r} l_m(c)): the model's own loss on the hard
    tokens, without the token-wise min against the baseline. S_r: the top r fraction of tokens by
    min_m (l_m(c, t) + l_m(c', t)) / 2 (T_r with a baseline symmetric in c and c')."""
    n_m, _, n_t = stack.shape
    paper = np.full((len(pairs), len(r_values), n_m), np.nan)
    own = np.full_like(paper, np.nan)
    for i, (k, k2) in enumerate(pairs):
        if not available[:, k].any():
            continue
        b = np.min(stack[available[:, k], k], axis=0)  # b(c, t) over the models that can serve c
        order = np.argsort(-b, kind="stable")  # hardest first
        both = available[:, k] & available[:, k2]
        if not both.any():
            continue
        now, nxt = stack[both][:, k], stack[both][:, k2]  # [n_both, n_t]
        # hard tokens for the own gain: by a baseline symmetric in c and c' for every model, so that
        # a model whose losses at c and c' are exchangeable (no gain) has no gain in expectation
        # (selecting by b(c) alone would pick tokens where its loss at c happened to be high).
        sym = np.argsort(-np.min((now + nxt) / 2, axis=0), kind="stable")
        for j, r in enumerate(r_values):
            n_hard = max(1, int(round(r * n_t)))
            hard = order[:n_hard]  # T_r
            f_cc = b[hard].mean()  # f_m(c, c) = mean min(b, l_m(c)) = mean b: the same for every m
            f_cc2 = np.minimum(b[hard], nxt[:, hard]).mean(-1)
            paper[i, j, both] = 1.0 - np.exp(f_cc2 - f_cc)  # (e^f(c,c) - e^f(c,c')) / e^f(c,c)
            hs = sym[:n_hard]
            own[i, j, both] = 1.0 - np.exp(nxt[:, hs].mean(-1) - now[:, hs].mean(-1))
    return paper, own


def _first_stop(gain: np.ndarray, available: np.ndarray, pairs, threshold: float):
    """Per (r, m): index into pairs of the first served c whose gain < threshold or whose c + delta m
    cannot serve, and whether none qualified (censored at the last served c). -1: m serves no c."""
    k_of = np.array([k for k, _ in pairs])
    k2_of = np.array([k2 for _, k2 in pairs])
    served = available[:, k_of].T[:, None, :]  # [n_pairs, 1, n_m]
    stop = served & (~available[:, k2_of].T[:, None, :] | (gain < threshold))
    first = np.where(stop.any(0), stop.argmax(0), -1)
    last_served = np.where(served.any(0), len(pairs) - 1 - served[::-1].argmax(0), -1)
    censored = ~stop.any(0) & (last_served >= 0)
    return np.where(censored, last_served, first), censored


def recl(
    losses: dict[str, np.ndarray],
    contexts: Sequence[int],
    delta: int | None = None,
    r_values: Sequence[float] = R_VALUES,
    threshold: float = THRESHOLD,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """RECL of every model of a group: the paper's, and the guarded RECL the report shows.

    losses: model -> [len(contexts), n_tokens] per-token losses (nats), the same tokens for every
    model and context. contexts: increasing context lengths; c + delta must be among them for the
    gain at c to be defined (delta default: the grid step, which must then be uniform).

    recl_paper: the first c where the paper's gain g_m(c, c + delta) < threshold.
    recl: the first c where the paper's gain OR the model's own gain (1 - exp of the change of its
    own mean loss on the hard tokens T_r) is below the threshold. The token-wise min(b, l_m) credits
    any token whose loss happens to dip below the baseline, so a model far from the group's best, or
    a noisy one, gains "relative" at every c while its own loss does not fall; requiring its own
    loss to fall as well keeps exactly the gains the model makes. ``noise_credited``: recl_paper > recl.

    A model whose losses at some c are NaN cannot serve that context (e.g. ``learned`` past its
    table): the baseline at c is taken over the models that can, and the model's RECL stops at the
    last c it serves (``limited``): it cannot gain from context it cannot see.

    Returns (recl, gains): recl has one row per (model, r) with ``recl``, ``recl_paper``,
    ``censored`` (True: no c in the grid qualified; ``recl`` is then the last c tested and the true
    RECL is larger), ``limited`` and ``noise_credited``; gains one row per (model, r, c).
    """
    names, stack, available, pairs, contexts = _check(losses, contexts, delta)
    paper, own = _gains(stack, available, pairs, r_values)
    guarded = np.minimum(paper, own)
    rows = []
    for i, (k, k2) in enumerate(pairs):
        if not available[:, k].any():
            continue
        for j, r in enumerate(r_values):
            for m_i, m in enumerate(names):
                rows.append(
                    {
                        "model": m,
                        "r": r,
                        "c": contexts[k],
                        "c_next": contexts[k2],
                        "gain": paper[i, j, m_i],
                        "own_gain": own[i, j, m_i],
                        "serves_c": bool(available[m_i, k]),
                        "serves_next": bool(available[m_i, k2]),
                    }
                )
    gains = pd.DataFrame(rows)
    first_p, cens_p = _first_stop(paper, available, pairs, threshold)
    first_g, cens_g = _first_stop(guarded, available, pairs, threshold)
    out = []
    for m_i, m in enumerate(names):
        for j, r in enumerate(r_values):
            i, ip = first_g[j, m_i], first_p[j, m_i]
            if i < 0:
                out.append(
                    {
                        "model": m,
                        "r": r,
                        "recl": None,
                        "recl_paper": None,
                        "censored": False,
                        "limited": True,
                        "noise_credited": False,
                    }
                )
                continue
            k, k2 = pairs[i]
            out.append(
                {
                    "model": m,
                    "r": r,
                    "recl": contexts[k],
                    "recl_paper": contexts[pairs[ip][0]],
                    "censored": bool(cens_g[j, m_i]),
                    "limited": bool(not cens_g[j, m_i] and not available[m_i, k2]),
                    "noise_credited": bool(ip > i or (cens_p[j, m_i] and not cens_g[j, m_i])),
                }
            )
    return pd.DataFrame(out), gains


def recl_values(
    losses: dict[str, np.ndarray],
    contexts: Sequence[int],
    delta: int | None = None,
    r_values: Sequence[float] = R_VALUES,
    threshold: float = THRESHOLD,
) -> np.ndarray:
    """The guarded RECL only, [n_r, n_m] (NaN: serves no c), fast: for the bootstrap."""
    names, stack, available, pairs, contexts = _check(losses, contexts, delta)
    paper, own = _gains(stack, available, pairs, r_values)
    first, _ = _first_stop(np.minimum(paper, own), available, pairs, threshold)
    c_of = np.array([contexts[k] for k, _ in pairs] + [np.nan])
    return c_of[np.where(first < 0, len(pairs), first)]


def recl_bootstrap(
    losses: dict[str, np.ndarray],
    contexts: Sequence[int],
    blocks: np.ndarray,
    n_boot: int = 200,
    level: float = 0.9,
    seed: int = 0,
    r_values: Sequence[float] = R_VALUES,
    threshold: float = THRESHOLD,
    seeds: dict[str, np.ndarray] | None = None,
) -> pd.DataFrame:
    """Percentile interval of each model's (guarded) RECL over block resamples of the tokens.

    losses as for ``recl``; blocks [n_tokens]: the block of each token (consecutive tokens of a row,
    ``analysis.stats``); each replicate draws as many blocks with replacement, the same for every
    model (the baseline b and the hard tokens T_r are recomputed on it). seeds: model -> per-seed
    losses [n_seeds, n_c, n_tokens] whose mean is ``losses[model]``; each replicate also draws the
    seeds with replacement. Returns model, r, recl_lo, recl_hi (a censored replicate counts as its
    last c: the upper end is then a lower bound)."""
    rng = np.random.default_rng(seed)
    blocks = np.asarray(blocks)
    ids, inverse = np.unique(blocks, return_inverse=True)
    members = [np.flatnonzero(inverse == b) for b in range(len(ids))]
    names = list(losses)
    reps = []
    for _ in range(n_boot):
        take = np.concatenate([members[b] for b in rng.integers(0, len(ids), len(ids))])
        sample = {}
        for m in names:
            per_seed = (seeds or {}).get(m)
            if per_seed is not None and len(per_seed) > 1:
                sample[m] = per_seed[rng.integers(0, len(per_seed), len(per_seed))].mean(0)[:, take]
            else:
                sample[m] = np.asarray(losses[m])[:, take]
        reps.append(recl_values(sample, contexts, r_values=r_values, threshold=threshold))
    reps = np.stack(reps)  # [n_boot, n_r, n_m]
    a = (1 - level) / 2
    with warnings.catch_warnings():  # a cell that serves no c has only NaN replicates: NaN interval
        warnings.simplefilter("ignore", RuntimeWarning)
        lo = np.nanquantile(reps, a, axis=0, method="lower")
        hi = np.nanquantile(reps, 1 - a, axis=0, method="higher")
    return pd.DataFrame(
        [
            {"model": m, "r": r, "recl_lo": lo[j, i], "recl_hi": hi[j, i], "recl_level": level}
            for i, m in enumerate(names)
            for j, r in enumerate(r_values)
        ]
    )


def recl_text(value, censored: bool, limited: bool = False) -> str:
    """'128', '>256' (above the grid) or '16 (limit)' (the scheme cannot serve c + delta), 'n/a'."""
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "n/a"
    return f">{int(value)}" if censored else f"{int(value)} (limit)" if limited else str(int(value))


# ---- per-token losses at each context length ------------------------------------------------------


@dataclass
class ContextSettings:
    """Where and how the per-token losses are taken. Lengths in tokens; None: from the runs
    (delta = L / 2, c_max = 4 L with L the longest training segment of the group)."""

    split: str = "valid"
    n_rows: int = 8  # parallel streams (rows) of the split
    n_score: int = 128  # scored tokens per row (recall: only its answers among them count)
    delta: int | None = None
    c_min: int | None = None  # default: delta
    c_max: int | None = None
    mode: str = "auto"  # auto: memory for runs trained with memory, window for the others
    window_batch_tokens: int = 32768
    block: int = 32  # bootstrap block: consecutive scored tokens of a row (analysis/stats.py)
    n_boot: int = 200  # bootstrap replicates of each RECL
    level: float = 0.95  # coverage of the RECL interval

    def grid(self, runs: list[Run]) -> list[int]:
        """The evenly spaced RECL grid c_min, c_min + delta, ..., <= c_max."""
        L = max(r.segment_len for r in runs)
        delta = self.delta or max(1, L // 2)
        c_min = self.c_min or delta
        c_max = self.c_max or 4 * L
        if c_max < c_min + delta:
            raise ValueError(
                f"the context grid needs c_max >= c_min + delta, got c_min {c_min}, delta {delta}, c_max {c_max}"
            )
        return list(range(c_min, c_max + 1, delta))

    def contexts(self, runs: list[Run]) -> list[int]:
        """The grid plus every run's training attention length (its memory M, or its segment L without
        memory), so that the loss at the training attention length is measured on the same tokens."""
        grid = self.grid(runs)
        extra = {train_attention_length(r) for r in runs if train_attention_length(r) <= grid[-1]}
        return sorted(set(grid) | extra)


def train_attention_length(run: Run) -> int:
    """The attention length of training, in previous tokens: the memory M with recurrence (the
    paper's convention; tokens saw M to M + L - 1), L - 1 without (the most any token saw: the last
    of a segment). The attention-length axis of the ablation table starts here."""
    return run.mem_len if run.recurrence else run.segment_len - 1


def run_mode(run: Run, mode: str) -> str:
    if mode == "auto":
        return "memory" if run.recurrence else "window"
    if mode not in ("memory", "window"):
        raise ValueError(f"context mode must be auto, memory or window, got {mode!r}")
    return mode


def dump_context_losses(
    run: Run, contexts: list[int], s: ContextSettings, path: Path, grid: list[int] | None = None, log=print
) -> Path:
    """Per-token losses of ``run`` at every context length, saved as ``path`` (npz, atomically): loss
    [n_c, n_rows, n_score] nats, correct (same shape), mask [n_rows, n_score] (tokens that count),
    distance [n_rows, n_score], contexts, and a JSON ``meta`` (run, corpus, split, mode, rows).
    A dump with the same settings is reused; an unreadable one (truncated) is named and recomputed."""
    from posenc_lab.context import context_losses, stream_rows
    from posenc_lab.io import CorruptFileError, load_npz, save_npz

    mode = run_mode(run, s.mode)
    meta = {
        "run": run.name,
        "run_dir": str(run.path),
        "scheme": run.scheme,
        "mem_len": run.mem_len,
        "loss": run.loss,
        "seed": run.seed,
        "steps": (run.results or {}).get("steps"),
        "corpus": run.corpus_key,
        "split": s.split,
        "mode": mode,
        "n_rows": s.n_rows,
        "n_score": s.n_score,
        "score_start": max(contexts),
        "contexts": contexts,
        "grid": grid if grid is not None else contexts,
    }
    if path.is_file():  # reuse a dump made with the same settings
        try:
            saved = json.loads(str(load_npz(path)["meta"]))
            saved.pop("not_applicable", None)
            if saved == meta:
                return path
        except (CorruptFileError, KeyError, ValueError) as e:
            log(f"  {path} cannot be read ({e}); recomputing it")
    data, side = run.split(s.split)
    start = max(contexts)
    rows = stream_rows(data, s.n_rows, start + s.n_score)

    def take(a: np.ndarray) -> np.ndarray:  # a side array at the scored targets
        return np.asarray(stream_rows(a.astype(np.int64), s.n_rows, start + s.n_score))[:, start + 1 :]

    mask = take(side["loss_mask"]).astype(bool) if "loss_mask" in side else np.ones((s.n_rows, s.n_score), bool)
    distance = take(side["distance"]) if "distance" in side else np.full((s.n_rows, s.n_score), -1)
    model = run.model()
    loss, correct = [], []
    reasons = {}
    for c in contexts:
        try:
            res = context_losses(
                model,
                rows,
                c,
                score_start=start,
                n_score=s.n_score,
                mode=mode,
                segment_len=run.segment_len,
                window_batch_tokens=s.window_batch_tokens,
            )
        except ValueError as e:  # the scheme cannot serve this context: NaN, with the reason in meta
            reasons[c] = str(e)
            loss.append(np.full((s.n_rows, s.n_score), np.nan, dtype=np.float32))
            correct.append(np.zeros((s.n_rows, s.n_score), dtype=bool))
            continue
        loss.append(res.loss.numpy())
        correct.append(res.correct.numpy())
    meta_out = {**meta, "not_applicable": {str(c): r for c, r in reasons.items()}}
    save_npz(
        path,
        loss=np.stack(loss).astype(np.float32),
        correct=np.stack(correct),
        mask=mask,
        distance=distance,
        contexts=np.array(contexts),
        meta=json.dumps(meta_out),
    )
    return path


@dataclass
class Dumps:
    """The per-token losses of a group, read from its dumps (every run scored on the same tokens).

    tokens: run -> [n_c, n_rows, n_score] nats; mask [n_rows, n_score]: the tokens that count."""

    tokens: dict[str, np.ndarray]
    mask: np.ndarray
    contexts: list[int]
    metas: list[dict]

    @property
    def losses(self) -> dict[str, np.ndarray]:
        """run -> [n_c, n_tokens counted]: the counted tokens, flattened row by row."""
        return {m: a[:, self.mask] for m, a in self.tokens.items()}

    def blocks(self, block: int) -> np.ndarray:
        """[n_tokens counted]: the block of each counted token (``block`` consecutive tokens of a row)."""
        rows, cols = np.nonzero(self.mask)
        return rows * (-(-self.mask.shape[1] // block)) + cols // block


def read_dumps(paths: Sequence[Path]) -> Dumps:
    """Per-token losses of a group from dumps. Errors: no dumps, an unreadable dump (named, with
    what to delete), mixed corpora/splits/rows, different context grids or scored tokens."""
    from posenc_lab.io import CorruptFileError, load_npz

    if not paths:
        raise RunError("no per-token loss dumps (context_losses/*.npz) to compute RECL from")
    tokens, metas, contexts, mask = {}, [], None, None
    for p in paths:
        p = Path(p)
        if not p.is_file():
            raise RunError(f"per-token loss dump {p}: no such file")
        try:
            z = load_npz(p, remedy="delete it; the next analysis of its run recomputes it")
        except CorruptFileError as e:
            raise RunError(str(e)) from e
        if not {"loss", "mask", "contexts", "meta"} <= set(z):
            raise RunError(f"{p} is not a context-loss dump (needs loss, mask, contexts, meta)")
        meta = json.loads(str(z["meta"]))
        c = z["contexts"].tolist()
        if contexts is None:
            contexts, mask = c, z["mask"].astype(bool)
        elif c != contexts:
            raise RunError(
                f"{p}: context grid {c} differs from {contexts} of the other dumps; dump the group with one grid"
            )
        elif not np.array_equal(z["mask"].astype(bool), mask):
            raise RunError(
                f"{p}: its scored tokens differ from the other dumps'; every run must be scored on "
                f"the same tokens (dump the group with one setting)"
            )
        tokens[meta["run"]] = z["loss"]
        metas.append(meta)
    corpora = {(m["corpus"], m["split"], m["n_rows"], m["n_score"], m["score_start"]) for m in metas}
    if len({m["corpus"] for m in metas}) > 1:
        listed = "; ".join(f"{m['run']}: {m['corpus']}" for m in metas)
        raise RunError(f"a RECL group must share one corpus; these dumps mix corpora: {listed}")
    if len(corpora) > 1:
        raise RunError(f"a RECL group must score the same tokens; the dumps differ in split or rows: {sorted(corpora)}")
    return Dumps(tokens, mask, contexts, metas)


# ---- recall: accuracy by distance -------------------------------------------------------------------

DISTANCE_BIN = 8


def recall_accuracy(
    run: Run, split: str = "valid", n_rows: int = 16, n_tokens: int = 4096, bin_width: int = DISTANCE_BIN
) -> pd.DataFrame:
    """Answer accuracy of ``run`` on the recall probe by distance bin, evaluated as trained (its
    segment length and memory, one ordered pass from an empty memory over ``n_rows`` streams)."""
    from posenc_lab.context import stream_losses, stream_rows

    data, side = run.split(split)
    if "distance" not in side:
        raise RunError(
            f"run {run.name}: corpus {run.corpus_name} has no distances (accuracy by distance needs the recall probe)"
        )
    n_tokens = min(n_tokens, (len(data) - 1) // n_rows - 1)
    rows = stream_rows(data, n_rows, n_tokens)
    res = stream_losses(run.model(), rows, segment_len=run.segment_len, mem_len=run.mem_len)
    dist = np.asarray(stream_rows(side["distance"].astype(np.int64), n_rows, n_tokens))[:, 1:]
    answered = dist >= 0
    df = pd.DataFrame({"distance": dist[answered], "correct": res.correct.numpy()[answered]})
    df["bin_lo"] = (df["distance"] // bin_width) * bin_width
    out = df.groupby("bin_lo").agg(accuracy=("correct", "mean"), answers=("correct", "size")).reset_index()
    out["distance"] = out["bin_lo"] + (bin_width - 1) / 2
    n_values = sum(1 for s in (run.corpus().itos or []) if s.startswith("v")) or None
    out["chance"] = 1 / n_values if n_values else float("nan")
    for k, v in run.key.items():
        out[k] = v
    out["segment_len"] = run.segment_len
    return out


# ---- the analysis ----------------------------------------------------------------------------------


@dataclass
class EffectiveContextResult:
    recl: pd.DataFrame  # cell, scheme, recurrence, mem_len, loss, n_seeds, r, recl, recl_lo, recl_hi, ...
    gains: pd.DataFrame
    loss_by_context: pd.DataFrame  # run, cell, seed, ..., c, loss_nats (mean over counted tokens)
    recall: pd.DataFrame | None
    dumps: Dumps | None = None  # the per-token losses (the report's intervals resample them)
    figures: dict[str, Path] = field(default_factory=dict)
    grid: list[int] = field(default_factory=list)  # the evenly spaced RECL grid


def recl_of_cells(d: Dumps, grid: list[int], s: ContextSettings) -> tuple[pd.DataFrame, pd.DataFrame]:
    """RECL of every cell (runs equal but for the seed: one model of the group, its per-token loss
    the mean over its seeds), with a bootstrap interval over blocks of tokens and the cell's seeds."""
    on_grid = [d.contexts.index(c) for c in grid]
    by_cell: dict[str, list[dict]] = {}
    for m in d.metas:
        by_cell.setdefault(cell_name(m["scheme"], m["mem_len"], m["loss"]), []).append(m)
    losses = d.losses
    per_seed = {cell: np.stack([losses[m["run"]][on_grid] for m in ms]) for cell, ms in by_cell.items()}
    mean = {cell: x.mean(0) for cell, x in per_seed.items()}
    table, gains = recl(mean, grid)
    iv = recl_bootstrap(mean, grid, d.blocks(s.block), n_boot=s.n_boot, level=s.level, seeds=per_seed)
    table = table.merge(iv, on=["model", "r"])
    keys = pd.DataFrame(
        [
            {
                "cell": cell,
                "scheme": ms[0]["scheme"],
                "recurrence": "on" if ms[0]["mem_len"] else "off",
                "mem_len": ms[0]["mem_len"],
                "loss": ms[0]["loss"],
                "mode": ms[0]["mode"],
                "n_seeds": len(ms),
                "runs": " ".join(m["run"] for m in ms),
            }
            for cell, ms in by_cell.items()
        ]
    )
    table = keys.merge(table.rename(columns={"model": "cell"}), on="cell")
    gains = keys.merge(gains.rename(columns={"model": "cell"}), on="cell")
    return table, gains


def analyze(
    runs: list[Run],
    out: Path,
    settings: ContextSettings | None = None,
    recall_rows: int = 16,
    recall_tokens: int = 4096,
    log=print,
) -> EffectiveContextResult:
    """RECL of ``runs`` as one group (one corpus, or a RunError), loss by context and, on recall,
    accuracy by distance. Writes CSVs and PNGs into ``out``."""
    s = settings or ContextSettings()
    one_corpus(runs, "RECL")
    out.mkdir(parents=True, exist_ok=True)
    grid = s.grid(runs)
    contexts = s.contexts(runs)
    paths = []
    for i, run in enumerate(runs, 1):
        log(
            f"  context losses [{i}/{len(runs)}] {run.label}: c = {grid[0]}..{grid[-1]} step "
            f"{grid[1] - grid[0]}, mode {run_mode(run, s.mode)}"
        )
        paths.append(dump_context_losses(run, contexts, s, out / "context_losses" / f"{run.name}.npz", grid, log))
    d = read_dumps(paths)
    by_name = {r.name: r for r in runs}
    table, gains = recl_of_cells(d, grid, s)
    lbc = pd.DataFrame(
        [
            {
                **by_name[m].key,
                "cell": by_name[m].cell,
                "seed": by_name[m].seed,
                "mode": run_mode(by_name[m], s.mode),
                "c": c,
                "loss_nats": float(v.mean()),
                "on_grid": c in grid,
                "train_attn_len": train_attention_length(by_name[m]),
            }
            for m, arr in d.losses.items()
            for c, v in zip(d.contexts, arr)
        ]
    )
    write_csv(table, out / "recl.csv")
    write_csv(gains, out / "recl_gains.csv")
    write_csv(lbc, out / "loss_by_context.csv")
    res = EffectiveContextResult(table, gains, lbc, None, dumps=d, grid=grid)
    unit = runs[0].unit
    res.figures["loss_by_context"] = plots.lines(
        lbc[np.isfinite(lbc["loss_nats"])],
        x="c",
        y="loss_nats",
        path=out / "loss_by_context.png",
        unit=unit,
        na=lbc[~np.isfinite(lbc["loss_nats"])],
        title="Loss by context length (every scored token sees exactly c previous tokens)",
        xlabel="context length c (tokens)",
    )
    if runs[0].corpus_name == "recall":
        parts = [recall_accuracy(r, s.split, recall_rows, recall_tokens) for r in runs]
        res.recall = pd.concat(parts, ignore_index=True)
        write_csv(res.recall, out / "recall_accuracy.csv")
        res.figures["recall_accuracy"] = plots.recall_accuracy(res.recall, out / "recall_accuracy.png")
    return res


# ---- the report's sections -----------------------------------------------------------------------


def _recl_text_of(h) -> str:
    text = recl_text(h["recl"], bool(h["censored"]), bool(h.get("limited", False)))
    if text != "n/a" and np.isfinite(h.get("recl_lo", np.nan)):
        text += f" [{int(h['recl_lo'])}, {int(h['recl_hi'])}]"
    return text


def recl_table(t: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: the guarded RECL with its interval per r, the paper's RECL, the flag."""
    rows = []
    for cell, g in t.groupby("cell", sort=False):
        first = g.iloc[0]
        row = {k: first[k] for k in ("scheme", "recurrence", "mem_len", "loss", "mode", "n_seeds")}
        for r in R_VALUES:
            h = g[g["r"] == r]
            row[f"recl_r{r:g}"] = _recl_text_of(h.iloc[0]) if len(h) else "n/a"
        for r in R_VALUES:
            h = g[g["r"] == r]
            row[f"paper_r{r:g}"] = recl_text(h.iloc[0]["recl_paper"], False) if len(h) else "n/a"
        row["noise_credited"] = bool(g["noise_credited"].any())
        row["cell"] = cell
        rows.append(row)
    return pd.DataFrame(rows)


def recl_findings(t: pd.DataFrame, level: float) -> list[str]:
    lines = []
    t = t.copy()
    t["recl"] = pd.to_numeric(t["recl"], errors="coerce")
    for r in R_VALUES:
        g = t[(t["r"] == r) & t["recl"].notna()]
        if g.empty:
            continue
        top, low = g["recl"].max(), g["recl"].min()
        if top == low:
            above = " (above the grid)" if g["censored"].all() else ""
            lines.append(f"r = {r:g}: every cell has RECL {int(top)}{above}.")
            continue
        leaders = g[g["recl"] == top]
        lows = g[g["recl"] == low]
        low_txt = ", ".join(lows["cell"]) if len(lows) <= 3 else f"{len(lows)} of the {len(g)} cells"
        lines.append(
            f"r = {r:g}: largest RECL {'>' if leaders['censored'].any() else ''}{int(top)} tokens for "
            + ", ".join(f"{x['cell']} [{x['recl_lo']:.0f}, {x['recl_hi']:.0f}]" for _, x in leaders.iterrows())
            + f"; smallest {int(low)} for {low_txt}."
        )
    full = t[(t["loss"] == "full") & (t["r"] == 0.1) & t["recl"].notna()]
    pairs = []
    for scheme, g in full.groupby("scheme", sort=False):
        on, off = g[g["recurrence"] == "on"], g[g["recurrence"] == "off"]
        if len(on) and len(off):
            a, b = on.iloc[0], off.iloc[0]
            sep = a["recl_lo"] > b["recl_hi"] or b["recl_lo"] > a["recl_hi"]
            pairs.append(f"{scheme} {_recl_text_of(a)} vs {_recl_text_of(b)}" + ("" if sep else " (intervals overlap)"))
    if pairs:
        lines.append("RECL (r = 0.1) with vs without memory: " + "; ".join(pairs) + ".")
    flagged = t[t["noise_credited"]]
    if len(flagged):
        lines.append(
            "The paper's definition credits more context than the model's own loss shows for "
            + "; ".join(
                f"{cell} (paper {', '.join(recl_text(v, False) for v in g['recl_paper'])} "
                f"vs {', '.join(recl_text(v, bool(c)) for v, c in zip(g['recl'], g['censored']))} "
                f"at r = {', '.join(f'{r:g}' for r in g['r'])})"
                for cell, g in flagged.groupby("cell", sort=False)
            )
            + ": the token-wise min against the group's best picks up per-token fluctuations. Shown: the "
            "guarded RECL (see the text above)."
        )
    if t["censored"].any():
        lines.append(
            "'>c': the gain stayed above the threshold up to the largest context tested, so the true RECL "
            "is larger than the grid shows."
        )
    if "limited" in t and t["limited"].any():
        names = sorted({x["scheme"] for _, x in t[t["limited"]].iterrows()})
        lines.append(
            f"'(limit)': {', '.join(names)} cannot be evaluated at the next context length (see the "
            f"not-applicable table), so its RECL stops where its reach does."
        )
    return lines


def section(
    res: EffectiveContextResult, s: ContextSettings, n_runs: int, paper_recl: Sequence[str] = (), suffix: str = ""
):
    """The report's RECL section."""
    from .sections import Figure, Section, Table

    grid = res.grid
    text = (
        f"RECL (Transformer-XL appendix C) of this group of {n_runs} runs, from per-token losses at context "
        f"lengths c = {grid[0]}..{grid[-1]} (step delta = {grid[1] - grid[0]}), {s.n_rows} x {s.n_score} scored "
        f"tokens of the {s.split} split: runs with memory use memory c with the same-length mask, runs without "
        f"memory a sliding window of c tokens. One model per cell: the per-token loss averaged over its seeds. "
        f"The paper's RECL (`paper_r*`) = the first c where extending the context by delta gains less than 1% "
        f"relative to the group's best, min(b(c, t), l_m(c + delta, t)) on the hard tokens (the top r fraction). "
        f"That token-wise min credits every token whose loss happens to dip below the baseline, whether or not "
        f'the model uses the context: a model far from the group\'s best, or a noisy one, keeps "gaining" '
        f"while its own mean loss stays flat or rises. `recl_r*` (the RECL shown) therefore also requires the "
        f"model's own mean loss on the hard tokens to fall by 1% (hard tokens chosen by a baseline symmetric in "
        f"c and c + delta, so pure noise gains nothing in expectation); `noise_credited`: the two differ. "
        f"Brackets: the {s.level:.0%} bootstrap interval over blocks of {s.block} tokens and the cell's seeds "
        f"({s.n_boot} replicates). Per-token losses: `effective_context/context_losses/*.npz`."
        + (
            " For scale, the paper's values on WikiText-103 (Table 8, group 2; r = 0.1/0.5/1.0): "
            + ", ".join(paper_recl)
            + "."
            if paper_recl
            else ""
        )
    )
    t = recl_table(res.recl)
    figs = [Figure(res.figures["loss_by_context"], "mean loss when every scored token sees exactly c previous tokens")]
    if res.recall is not None:
        figs.append(Figure(res.figures["recall_accuracy"], "accuracy by distance"))
    return Section(
        f"Relative effective context length (RECL){' (' + suffix.strip('_') + ')' if suffix else ''}",
        text,
        [
            Table(
                f"table_recl{suffix}",
                t,
                "RECL in tokens [interval] for r = 0.1, 0.5, 1.0 ('>c': above "
                "the grid; '(limit)': the scheme cannot serve the next context length), and the paper's",
            )
        ],
        figs,
        recl_findings(res.recl, s.level),
    )


def _wilson(k: float, n: float, level: float) -> tuple[float, float]:
    """Wilson interval of a proportion k / n at ``level``."""
    from statistics import NormalDist

    if n <= 0:
        return float("nan"), float("nan")
    z = NormalDist().inv_cdf(0.5 + level / 2)
    p = k / n
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return mid - half, mid + half


def _who(row) -> str:
    return f"{row['scheme']} (memory {row['recurrence']}, {row['loss']} loss)"


def _accuracy(bins: pd.DataFrame) -> float:
    return float(np.average(bins["accuracy"], weights=bins["answers"])) if len(bins) else np.nan


def recall_table(acc: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """Per run: accuracy within one segment and beyond it, with the Wilson interval beyond it."""
    rows = []
    for key, g in acc.groupby(["run", "scheme", "recurrence", "mem_len", "loss"], sort=False):
        L = int(g["segment_len"].iloc[0])
        within = g[g["bin_lo"] + DISTANCE_BIN <= L]  # bins entirely below L
        beyond = g[g["bin_lo"] >= L]
        n_beyond = float(beyond["answers"].sum())
        lo, hi = _wilson(float((beyond["accuracy"] * beyond["answers"]).sum()), n_beyond, level)
        rows.append(
            {
                "scheme": key[1],
                "recurrence": key[2],
                "mem_len": key[3],
                "loss": key[4],
                "acc_within_L": _accuracy(within),
                "acc_beyond_L": _accuracy(beyond),
                "beyond_lo": lo,
                "beyond_hi": hi,
                "chance": float(g["chance"].iloc[0]),
                "answers": int(g["answers"].sum()),
                "segment_len": L,
                "run": key[0],
            }
        )
    return pd.DataFrame(rows)


def recall_findings(t: pd.DataFrame, smoke: bool = False) -> list[str]:
    """Accuracy beyond one segment against chance, and memory on vs off per scheme, from the intervals."""
    lines = []
    ok = t[np.isfinite(t["acc_beyond_L"])]
    if len(ok):
        top = ok.loc[ok["acc_beyond_L"].idxmax()]
        above = ok[ok["beyond_lo"] > ok["chance"]]
        lines.append(
            f"Beyond one segment, {_who(top)} answers best ({top['acc_beyond_L']:.1%}); "
            f"{len(above)} of {len(ok)} runs are above chance there (interval entirely above it)"
            + (f": {', '.join(_who(r) for _, r in above.iterrows())}." if len(above) else ".")
        )
    for _, r in t.iterrows():
        lines.append(
            f"{_who(r)}: {r['acc_within_L']:.1%} within one segment, {r['acc_beyond_L']:.1%} "
            f"[{r['beyond_lo']:.1%}, {r['beyond_hi']:.1%}] beyond it (chance {r['chance']:.1%})."
        )
    from .stats import combine, verdict

    order = []
    for scheme, g in ok.groupby("scheme", sort=False):
        on, off = g[g["recurrence"] == "on"], g[g["recurrence"] == "off"]
        if len(on) and len(off):
            order.append((scheme, accuracy_difference(on.iloc[0], off.iloc[0])))
    if order:
        v = "not judged (smoke run)" if smoke else combine([verdict(iv, ">0") for _, iv in order])
        lines.append(
            f'Expected ordering "with memory answers beyond one segment better than without": **{v}** '
            "(accuracy with minus without memory, Newcombe interval: "
            + "; ".join(f"{s} {iv.text(3)}" for s, iv in order)
            + ")."
        )
    return lines


def accuracy_difference(a, b):
    """Newcombe's hybrid score interval of the difference of two proportions (rows of recall_table:
    acc_beyond_L with its Wilson interval beyond_lo/hi): an ``analysis.stats.Interval``."""
    from .stats import Interval

    p1, l1, u1 = a["acc_beyond_L"], a["beyond_lo"], a["beyond_hi"]
    p2, l2, u2 = b["acc_beyond_L"], b["beyond_lo"], b["beyond_hi"]
    d = p1 - p2
    return Interval(
        float(d), float(d - math.hypot(p1 - l1, u2 - p2)), float(d + math.hypot(u1 - p1, p2 - l2)), float("nan")
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m posenc_lab_analysis.effective_context",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("runs", nargs="*", help="run directories or folders holding runs (one RECL group: one corpus)")
    p.add_argument("--out", required=True, type=Path, help="output folder (CSV, PNG, context_losses/*.npz)")
    p.add_argument("--from-dumps", type=Path, help="compute RECL from existing context_losses/*.npz only")
    for f in ContextSettings.__dataclass_fields__.values():
        p.add_argument(
            f"--{f.name.replace('_', '-')}", type=type(f.default) if f.default is not None else int, default=f.default
        )
    add_threads_argument(p)
    a = p.parse_args(argv)
    apply_threads(a.threads)
    settings = ContextSettings(**{k: getattr(a, k) for k in ContextSettings.__dataclass_fields__})
    try:
        if a.from_dumps:
            d = read_dumps(sorted(a.from_dumps.glob("*.npz")))
            table, gains = recl_of_cells(d, d.metas[0].get("grid", d.contexts), settings)
            a.out.mkdir(parents=True, exist_ok=True)
            write_csv(table, a.out / "recl.csv")
            write_csv(gains, a.out / "recl_gains.csv")
        else:
            if not a.runs:
                p.error("give run directories, or --from-dumps")
            table = analyze(find_runs(a.runs), a.out, settings).recl
    except (RunError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with pd.option_context("display.width", 200):
        print(table.to_string(index=False))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
