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

    python -m analysis.effective_context RUN_OR_FOLDER... --out DIR [--delta 32 --c-max 256]
    python -m analysis.effective_context --from-dumps DIR/context_losses --out DIR
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from . import plots
from .runs import Run, RunError, find_runs, one_corpus, add_threads_argument, apply_threads

R_VALUES = (0.1, 0.5, 1.0)
THRESHOLD = 0.01


# ---- RECL on per-token loss arrays (pure) --------------------------------------------------------

def recl(losses: dict[str, np.ndarray], contexts: Sequence[int], delta: int | None = None,
         r_values: Sequence[float] = R_VALUES, threshold: float = THRESHOLD) -> tuple[pd.DataFrame, pd.DataFrame]:
    """RECL of every model of a group.

    losses: model -> [len(contexts), n_tokens] per-token losses (nats), the same tokens for every
    model and context. contexts: increasing context lengths; c + delta must be among them for the
    gain at c to be defined (delta default: the grid step, which must then be uniform).

    A model whose losses at some c are NaN cannot serve that context (e.g. ``learned`` past its
    table): the baseline at c is taken over the models that can, and the model's RECL stops at the
    last c it serves (``limited``): it cannot gain from context it cannot see.

    Returns (recl, gains): recl has one row per (model, r) with ``recl`` (the first c with gain below
    the threshold), ``censored`` (True: no c in the grid qualified; ``recl`` is then the last c
    tested and the true RECL is larger) and ``limited``; gains has one row per (model, r, c).
    """
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
    pairs = [(c, c + delta) for c in contexts if c + delta in index]
    if not pairs:
        raise ValueError(f"no context c in {contexts} has c + delta = c + {delta} in the grid")
    names = list(losses)
    stack = np.stack([np.asarray(losses[m], dtype=np.float64) for m in names])  # [n_m, n_c, n_t]
    if stack.ndim != 3 or stack.shape[1] != len(contexts):
        raise ValueError(f"each model's losses must be [len(contexts)={len(contexts)}, n_tokens]; got "
                         + ", ".join(f"{m}: {np.shape(losses[m])}" for m in names))
    if np.isinf(stack).any():
        raise ValueError("per-token losses contain inf")
    # NaN = the model cannot serve that context length at all (e.g. a learned table too short):
    # a whole row [m, c, :] must then be NaN.
    na = np.isnan(stack)
    partial = na.any(axis=2) & ~na.all(axis=2)
    if partial.any():
        m, k = np.argwhere(partial)[0]
        raise ValueError(f"model {names[m]} has NaN losses for some tokens at c = {contexts[k]}")
    available = ~na[:, :, 0]  # [n_m, n_c]
    n_t = stack.shape[2]

    rows = []
    for c, c2 in pairs:
        k, k2 = index[c], index[c2]
        if not available[:, k].any():
            continue
        b = np.nanmin(stack[available[:, k], k], axis=0)  # b(c, t) over the models that can serve c
        order = np.argsort(-b, kind="stable")  # hardest first
        for r in r_values:
            hard = order[:max(1, int(round(r * n_t)))]  # T_r
            f_cc = b[hard].mean()  # f_m(c, c) = mean min(b, l_m(c)) = mean b: the same for every m
            for m_i, m in enumerate(names):
                if not (available[m_i, k] and available[m_i, k2]):
                    gain = float("nan")  # m cannot serve c or c + delta
                else:
                    f_cc2 = np.minimum(b[hard], stack[m_i, k2, hard]).mean()
                    gain = (math.exp(f_cc) - math.exp(f_cc2)) / math.exp(f_cc)
                rows.append({"model": m, "r": r, "c": c, "c_next": c2, "gain": gain,
                             "serves_c": bool(available[m_i, k]), "serves_next": bool(available[m_i, k2])})
    gains = pd.DataFrame(rows)
    out = []
    for (m, r), g in gains.groupby(["model", "r"], sort=False):
        served = g[g["serves_c"]]
        stop = served[(served["gain"] < threshold) | ~served["serves_next"]]
        if served.empty:
            out.append({"model": m, "r": r, "recl": None, "censored": False, "limited": True})
        elif len(stop):
            first = stop.iloc[0]
            out.append({"model": m, "r": r, "recl": int(first["c"]), "censored": False,
                        "limited": not bool(first["serves_next"])})
        else:
            out.append({"model": m, "r": r, "recl": int(served["c"].iloc[-1]), "censored": True, "limited": False})
    return pd.DataFrame(out), gains


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

    def grid(self, runs: list[Run]) -> list[int]:
        """The evenly spaced RECL grid c_min, c_min + delta, ..., <= c_max."""
        L = max(r.segment_len for r in runs)
        delta = self.delta or max(1, L // 2)
        c_min = self.c_min or delta
        c_max = self.c_max or 4 * L
        if c_max < c_min + delta:
            raise ValueError(f"the context grid needs c_max >= c_min + delta, got c_min {c_min}, delta {delta}, "
                             f"c_max {c_max}")
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


def dump_context_losses(run: Run, contexts: list[int], s: ContextSettings, path: Path,
                        grid: list[int] | None = None) -> Path:
    """Per-token losses of ``run`` at every context length, saved as ``path`` (npz): loss
    [n_c, n_rows, n_score] nats, correct (same shape), mask [n_rows, n_score] (tokens that count),
    distance [n_rows, n_score], contexts, and a JSON ``meta`` (run, corpus, split, mode, rows)."""
    from posenc_lab.context import context_losses, stream_rows

    mode = run_mode(run, s.mode)
    meta = {"run": run.name, "run_dir": str(run.path), "scheme": run.scheme, "mem_len": run.mem_len,
            "loss": run.loss, "corpus": run.corpus_key, "split": s.split, "mode": mode,
            "n_rows": s.n_rows, "n_score": s.n_score, "score_start": max(contexts), "contexts": contexts,
            "grid": grid if grid is not None else contexts}
    if path.is_file():  # reuse a dump made with the same settings
        with np.load(path) as z:
            saved = json.loads(str(z["meta"]))
            saved.pop("not_applicable", None)
            if saved == meta:
                return path
    data, side = run.split(s.split)
    start = max(contexts)
    rows = stream_rows(data, s.n_rows, start + s.n_score)
    take = lambda a: np.asarray(stream_rows(a.astype(np.int64), s.n_rows, start + s.n_score))[:, start + 1:]  # noqa: E731
    mask = take(side["loss_mask"]).astype(bool) if "loss_mask" in side else np.ones((s.n_rows, s.n_score), bool)
    distance = take(side["distance"]) if "distance" in side else np.full((s.n_rows, s.n_score), -1)
    model = run.model()
    loss, correct = [], []
    reasons = {}
    for c in contexts:
        try:
            res = context_losses(model, rows, c, score_start=start, n_score=s.n_score, mode=mode,
                                 segment_len=run.segment_len, window_batch_tokens=s.window_batch_tokens)
        except ValueError as e:  # the scheme cannot serve this context: NaN, with the reason in meta
            reasons[c] = str(e)
            loss.append(np.full((s.n_rows, s.n_score), np.nan, dtype=np.float32))
            correct.append(np.zeros((s.n_rows, s.n_score), dtype=bool))
            continue
        loss.append(res.loss.numpy())
        correct.append(res.correct.numpy())
    meta_out = {**meta, "not_applicable": {str(c): r for c, r in reasons.items()}}
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, loss=np.stack(loss).astype(np.float32), correct=np.stack(correct), mask=mask,
                        distance=distance, contexts=np.array(contexts), meta=json.dumps(meta_out))
    return path


def read_dumps(paths: Sequence[Path]) -> tuple[dict[str, np.ndarray], list[int], list[dict]]:
    """Per-token losses of a group from dumps: ({run: [n_c, n_tokens]}, contexts, metas).
    Errors: no dumps, mixed corpora/splits/rows, different context grids."""
    if not paths:
        raise RunError("no per-token loss dumps (context_losses/*.npz) to compute RECL from")
    losses, metas, contexts = {}, [], None
    for p in paths:
        p = Path(p)
        if not p.is_file():
            raise RunError(f"per-token loss dump {p}: no such file")
        with np.load(p) as z:
            if not {"loss", "mask", "contexts", "meta"} <= set(z.files):
                raise RunError(f"{p} is not a context-loss dump (needs loss, mask, contexts, meta)")
            meta = json.loads(str(z["meta"]))
            c = z["contexts"].tolist()
            mask = z["mask"].astype(bool)
            losses[meta["run"]] = z["loss"][:, mask]  # [n_c, n_tokens counted]
        if contexts is None:
            contexts = c
        elif c != contexts:
            raise RunError(f"{p}: context grid {c} differs from {contexts} of the other dumps; dump the group "
                           f"with one grid")
        metas.append(meta)
    corpora = {(m["corpus"], m["split"], m["n_rows"], m["n_score"], m["score_start"]) for m in metas}
    if len({m["corpus"] for m in metas}) > 1:
        listed = "; ".join(f"{m['run']}: {m['corpus']}" for m in metas)
        raise RunError(f"a RECL group must share one corpus; these dumps mix corpora: {listed}")
    if len(corpora) > 1:
        raise RunError(f"a RECL group must score the same tokens; the dumps differ in split or rows: {sorted(corpora)}")
    return losses, contexts, metas


# ---- recall: accuracy by distance -------------------------------------------------------------------

DISTANCE_BIN = 8


def recall_accuracy(run: Run, split: str = "valid", n_rows: int = 16, n_tokens: int = 4096,
                    bin_width: int = DISTANCE_BIN) -> pd.DataFrame:
    """Answer accuracy of ``run`` on the recall probe by distance bin, evaluated as trained (its
    segment length and memory, one ordered pass from an empty memory over ``n_rows`` streams)."""
    from posenc_lab.context import stream_losses, stream_rows

    data, side = run.split(split)
    if "distance" not in side:
        raise RunError(f"run {run.name}: corpus {run.corpus_name} has no distances (accuracy by distance needs "
                       f"the recall probe)")
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
    recl: pd.DataFrame  # run, scheme, recurrence, mem_len, loss, mode, r, recl, censored
    gains: pd.DataFrame
    loss_by_context: pd.DataFrame  # run, ..., c, loss_nats (mean over counted tokens)
    recall: pd.DataFrame | None
    figures: dict[str, Path] = field(default_factory=dict)
    grid: list[int] = field(default_factory=list)  # the evenly spaced RECL grid


def analyze(runs: list[Run], out: Path, settings: ContextSettings | None = None, recall_rows: int = 16,
            recall_tokens: int = 4096, log=print) -> EffectiveContextResult:
    """RECL of ``runs`` as one group (one corpus, or a RunError), loss by context and, on recall,
    accuracy by distance. Writes CSVs and PNGs into ``out``."""
    s = settings or ContextSettings()
    one_corpus(runs, "RECL")
    out.mkdir(parents=True, exist_ok=True)
    grid = s.grid(runs)
    contexts = s.contexts(runs)
    dumps = []
    for i, run in enumerate(runs, 1):
        log(f"  context losses [{i}/{len(runs)}] {run.label}: c = {grid[0]}..{grid[-1]} step "
            f"{grid[1] - grid[0]}, mode {run_mode(run, s.mode)}")
        dumps.append(dump_context_losses(run, contexts, s, out / "context_losses" / f"{run.name}.npz", grid))
    losses, contexts, metas = read_dumps(dumps)
    by_name = {r.name: r for r in runs}
    on_grid = [contexts.index(c) for c in grid]
    table, gains = recl({m: arr[on_grid] for m, arr in losses.items()}, grid)
    keys = pd.DataFrame([{**by_name[m["run"]].key, "mode": m["mode"]} for m in metas])
    table = keys.merge(table.rename(columns={"model": "run"}), on="run")
    gains = keys.merge(gains.rename(columns={"model": "run"}), on="run")
    lbc = pd.DataFrame([{**by_name[m].key, "mode": run_mode(by_name[m], s.mode), "c": c,
                         "loss_nats": float(v.mean()), "on_grid": c in grid,
                         "train_attn_len": train_attention_length(by_name[m])}
                        for m, arr in losses.items() for c, v in zip(contexts, arr)])
    table.to_csv(out / "recl.csv", index=False)
    gains.to_csv(out / "recl_gains.csv", index=False)
    lbc.to_csv(out / "loss_by_context.csv", index=False)
    res = EffectiveContextResult(table, gains, lbc, None, grid=grid)
    unit = runs[0].unit
    res.figures["loss_by_context"] = plots.lines(
        lbc[np.isfinite(lbc["loss_nats"])], x="c", y="loss_nats", path=out / "loss_by_context.png", unit=unit,
        na=lbc[~np.isfinite(lbc["loss_nats"])],
        title="Loss by context length (every scored token sees exactly c previous tokens)",
        xlabel="context length c (tokens)")
    if runs[0].corpus_name == "recall":
        parts = [recall_accuracy(r, s.split, recall_rows, recall_tokens) for r in runs]
        res.recall = pd.concat(parts, ignore_index=True)
        res.recall.to_csv(out / "recall_accuracy.csv", index=False)
        res.figures["recall_accuracy"] = plots.recall_accuracy(res.recall, out / "recall_accuracy.png")
    return res


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.effective_context", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="*", help="run directories or folders holding runs (one RECL group: one corpus)")
    p.add_argument("--out", required=True, type=Path, help="output folder (CSV, PNG, context_losses/*.npz)")
    p.add_argument("--from-dumps", type=Path, help="compute RECL from existing context_losses/*.npz only")
    for f in ContextSettings.__dataclass_fields__.values():
        p.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default) if f.default is not None else int,
                       default=f.default)
    add_threads_argument(p)
    a = p.parse_args(argv)
    apply_threads(a.threads)
    settings = ContextSettings(**{k: getattr(a, k) for k in ContextSettings.__dataclass_fields__})
    try:
        if a.from_dumps:
            losses, contexts, metas = read_dumps(sorted(a.from_dumps.glob("*.npz")))
            grid = metas[0].get("grid", contexts)
            on_grid = [contexts.index(c) for c in grid]
            table, gains = recl({m: arr[on_grid] for m, arr in losses.items()}, grid)
            a.out.mkdir(parents=True, exist_ok=True)
            table.to_csv(a.out / "recl.csv", index=False)
            gains.to_csv(a.out / "recl_gains.csv", index=False)
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
