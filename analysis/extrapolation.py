"""Extrapolation: the loss of every trained run along the two axes of shared/SCHEMES.md.

Window axis (longer than trained):
  - segment: evaluation segment length L' = L, 2L, ..., 16L, no memory (each segment alone);
    the loss is the mean over the same tokens for every L'.
  - memory: memory length M' = M, 2M, ..., 8M (M = the training memory, or L for runs trained
    without memory) with the same-length mask, segment L: every scored token attends to exactly
    M' previous tokens (its "attention length"), on the same scored tokens for every M'.
Horizon axis (later than trained): the run as trained (L, M) over streams much longer than its
training episodes (default 8 T), never reset: the loss as a function of the stream offset, and
its difference to the same tokens evaluated as trained (reset every T), which takes the text's
own difficulty out of the comparison.

Lengths a scheme cannot serve (``learned`` past its table) are rows with status "not applicable" and the
scheme's own reason, never a crash and never a silent gap.

    python -m posenc_lab_analysis.extrapolation RUN_OR_FOLDER... --out DIR
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from posenc_lab.tables import write_csv

from . import plots
from .runs import Run, RunError, add_threads_argument, apply_threads, find_runs

# (not "n/a": pandas reads that back as a missing value)
NA_STATUS = "not applicable"


@dataclass
class ExtrapolationSettings:
    split: str = "valid"
    n_rows: int = 8
    segment_factors: tuple[int, ...] = (1, 2, 4, 8, 16)  # L' / L
    memory_factors: tuple[int, ...] = (1, 2, 4, 8)  # M' / M
    memory_score: int | None = None  # scored tokens per row on the memory axis (default 2 L)
    horizon_factor: int = 8  # stream length / training episode length
    horizon_tokens: int = 4096  # stream length for runs trained without episodes
    horizon_bins: int = 32
    horizon_rows: int | None = None  # streams on the horizon axis (default n_rows)


def _row(run: Run, axis: str, length: int, factor: float, loss: float | None = None, reason: str = "", **extra) -> dict:
    return {
        **run.key,
        "axis": axis,
        "length": int(length),
        "factor": float(factor),
        "loss_nats": float("nan") if loss is None else float(loss),
        "status": "ok" if loss is not None else NA_STATUS,
        "reason": reason,
        **extra,
    }


def segment_axis(run: Run, s: ExtrapolationSettings, tokens: dict | None = None) -> list[dict]:
    from posenc_lab.context import stream_losses, stream_rows

    L = run.segment_len
    lengths = [f * L for f in s.segment_factors]
    data, side = run.split(s.split)
    n = max(lengths)
    rows = stream_rows(data, s.n_rows, n)
    mask = (
        np.asarray(stream_rows(side["loss_mask"].astype(np.int64), s.n_rows, n))[:, 1:].astype(bool)
        if "loss_mask" in side
        else None
    )
    model = run.model()
    out = []
    for Lp in lengths:
        try:
            # each segment alone and its own episode: positions 0..L'-1 for every scheme (the offsets
            # of global_sinusoid belong to the horizon axis)
            res = stream_losses(model, rows, segment_len=Lp, mem_len=0, episode_len=Lp)
        except ValueError as e:
            out.append(_row(run, "segment", Lp, Lp / L, reason=str(e)))
            continue
        out.append(_row(run, "segment", Lp, Lp / L, _scored_mean(res.loss.numpy(), mask)))
        _keep(tokens, run, "segment", Lp, res.loss.numpy(), mask)
    return out


def _keep(tokens: dict | None, run: Run, axis: str, length: int, loss: np.ndarray, mask: np.ndarray | None) -> None:
    """Keep the per-token losses [n_rows, n] (and the tokens that count) for the intervals."""
    if tokens is not None:
        tokens[(run.name, axis, int(length))] = (loss, mask)


def _scored_mean(loss: np.ndarray, mask: np.ndarray | None) -> float:
    """Mean loss over the scored tokens (answers only on recall), all tokens without a mask."""
    return float(loss[mask].mean() if mask is not None else loss.mean())


def memory_axis(run: Run, s: ExtrapolationSettings, tokens: dict | None = None) -> list[dict]:
    from posenc_lab.context import context_losses, stream_rows

    L = run.segment_len
    M_ref = run.mem_len or L
    lengths = [f * M_ref for f in s.memory_factors]
    n_score = s.memory_score or 2 * L
    start = max(lengths)
    data, side = run.split(s.split)
    rows = stream_rows(data, s.n_rows, start + n_score)
    mask = (
        np.asarray(stream_rows(side["loss_mask"].astype(np.int64), s.n_rows, start + n_score))[:, start + 1 :].astype(
            bool
        )
        if "loss_mask" in side
        else None
    )
    model = run.model()
    out = []
    for Mp in lengths:
        try:
            res = context_losses(model, rows, Mp, score_start=start, n_score=n_score, mode="memory", segment_len=L)
        except ValueError as e:
            out.append(_row(run, "memory", Mp, Mp / M_ref, reason=str(e)))
            continue
        out.append(_row(run, "memory", Mp, Mp / M_ref, _scored_mean(res.loss.numpy(), mask)))
        _keep(tokens, run, "memory", Mp, res.loss.numpy(), mask)
    return out


def horizon_axis(run: Run, s: ExtrapolationSettings, tokens: dict | None = None) -> list[dict]:
    """Loss by stream offset over streams of H tokens, never reset, and the difference to the same
    tokens evaluated as trained (memory and offset reset every training episode T): ``delta_nats``
    isolates what running past the training horizon does (0 inside the first episode by
    construction; past it, positions never seen minus any gain from the longer memory)."""
    from posenc_lab.context import stream_losses, stream_rows

    T = run.episode_len
    H = s.horizon_factor * T if T else s.horizon_tokens
    n_rows = s.horizon_rows or s.n_rows
    data, side = run.split(s.split)
    rows = stream_rows(data, n_rows, H)
    try:
        long = stream_losses(run.model(), rows, segment_len=run.segment_len, mem_len=run.mem_len)
        ref = (
            stream_losses(run.model(), rows, segment_len=run.segment_len, mem_len=run.mem_len, episode_len=T)
            if T
            else None
        )
    except ValueError as e:
        return [_row(run, "horizon", 0, 0.0, reason=str(e), train_horizon=T or -1)]
    loss = long.loss.numpy()
    delta = loss - ref.loss.numpy() if ref is not None else np.full_like(loss, np.nan)
    mask = (
        np.asarray(stream_rows(side["loss_mask"].astype(np.int64), n_rows, H))[:, 1:].astype(bool)
        if "loss_mask" in side
        else np.ones_like(loss, dtype=bool)
    )
    width = max(1, H // s.horizon_bins)
    offsets = long.offset.numpy()
    if T:  # past the training episodes: the per-token change against resets every T
        _keep(tokens, run, "horizon_past", T, delta, mask & (offsets >= T))
    # As trained (segments of L, memory M, resets every T): the same rows for every run of one T, so
    # runs with and without memory compare on the same tokens (the recurrence finding below).
    _keep(tokens, run, "as_trained", T or 0, ref.loss.numpy() if ref is not None else loss, mask)
    out = []
    for lo in range(0, H, width):
        sel = mask & (offsets >= lo) & (offsets < lo + width)
        if sel.any():
            out.append(
                _row(
                    run,
                    "horizon",
                    lo,
                    lo / T if T else float("nan"),
                    float(loss[sel].mean()),
                    train_horizon=T or -1,
                    tokens=int(sel.sum()),
                    delta_nats=float(delta[sel].mean()),
                )
            )
    return out


@dataclass
class ExtrapolationResult:
    table: pd.DataFrame
    summary: pd.DataFrame
    figures: dict[str, Path] = field(default_factory=dict)
    # (run, axis, length) -> (per-token losses [n_rows, n] nats, tokens that count or None)
    tokens: dict = field(default_factory=dict)


def summarize(table: pd.DataFrame, unit_scale: float) -> pd.DataFrame:
    """Per run: the loss at the training length and at the longest applicable evaluation length
    of each window axis, the first n/a length, and the horizon loss inside vs past the training
    episodes (in the corpus metric: bits per byte/char, nats per word)."""
    out = []
    keys = ["run", "scheme", "recurrence", "mem_len", "loss"]
    for key, g in table.groupby(keys, sort=False):
        row = dict(zip(keys, key))
        for axis in ("segment", "memory"):
            a = g[g["axis"] == axis]
            ok = a[a["status"] == "ok"]
            base = ok[ok["factor"] == 1.0]
            row[f"{axis}_at_1x"] = float(base["loss_nats"].iloc[0]) * unit_scale if len(base) else np.nan
            if len(ok):
                last = ok.iloc[-1]
                row[f"{axis}_longest"] = int(last["length"])
                row[f"{axis}_at_longest"] = float(last["loss_nats"]) * unit_scale
            na = a[a["status"] == NA_STATUS]
            row[f"{axis}_na_from"] = int(na["length"].min()) if len(na) else None
        h = g[(g["axis"] == "horizon") & (g["status"] == "ok")]
        T = int(h["train_horizon"].iloc[0]) if len(h) and "train_horizon" in h else -1
        if len(h) and T > 0:
            inside, past = h[h["length"] < T], h[h["length"] >= T]
            row["horizon_T"] = T
            row["horizon_inside"] = float(np.average(inside["loss_nats"], weights=inside["tokens"])) * unit_scale
            if len(past):
                row["horizon_past"] = float(np.average(past["loss_nats"], weights=past["tokens"])) * unit_scale
                row["horizon_past_delta"] = float(np.average(past["delta_nats"], weights=past["tokens"])) * unit_scale
                last = past.iloc[-1]
                row["horizon_last_delta"] = float(last["delta_nats"]) * unit_scale
        out.append(row)
    return pd.DataFrame(out)


def analyze(
    runs: list[Run], out: Path, settings: ExtrapolationSettings | None = None, log=print
) -> ExtrapolationResult:
    """Evaluate every run along the three axes; write extrapolation.csv, extrapolation_summary.csv
    and one PNG per axis into ``out``. Runs of several corpora are allowed (the figures facet by
    recurrence; compare corpora in separate calls for a clean picture)."""
    s = settings or ExtrapolationSettings()
    out.mkdir(parents=True, exist_ok=True)
    rows, tokens = [], {}
    for i, run in enumerate(runs, 1):
        log(f"  extrapolation [{i}/{len(runs)}] {run.label}")
        rows += segment_axis(run, s, tokens) + memory_axis(run, s, tokens) + horizon_axis(run, s, tokens)
    table = pd.DataFrame(rows)
    from .runs import metric_of

    unit = runs[0].unit
    name, scale = metric_of(unit)
    table["metric"] = table["loss_nats"] * scale
    if "delta_nats" in table:
        table["delta_metric"] = table["delta_nats"] * scale
    write_csv(table, out / "extrapolation.csv")
    summary = summarize(table, scale)
    write_csv(summary, out / "extrapolation_summary.csv")
    res = ExtrapolationResult(table, summary, tokens=tokens)
    L = runs[0].segment_len
    ok = table[table["status"] == "ok"]
    na = table[table["status"] == NA_STATUS]
    res.figures["segment"] = plots.lines(
        ok[ok["axis"] == "segment"],
        x="length",
        y="loss_nats",
        path=out / "extrapolation_segment.png",
        unit=unit,
        title="Window axis: evaluation segment length L' without memory",
        xlabel="evaluation segment length L' (tokens)",
        vlines={"train L": L},
        col="recurrence",
        na=na[na["axis"] == "segment"],
    )
    mems = sorted({r.mem_len for r in runs if r.mem_len})
    res.figures["memory"] = plots.lines(
        ok[ok["axis"] == "memory"],
        x="length",
        y="loss_nats",
        path=out / "extrapolation_memory.png",
        unit=unit,
        title="Window axis: attention length M' with memory (same-length mask)",
        xlabel="evaluation memory = attention length M' (tokens)",
        vlines={"train M": mems[0]} if len(mems) == 1 else None,
        col="recurrence",
        na=na[na["axis"] == "memory"],
    )
    hz = ok[ok["axis"] == "horizon"]
    Ts = sorted({r.episode_len for r in runs if r.episode_len})
    has_ref = "delta_nats" in hz and hz["delta_nats"].notna().any()
    res.figures["horizon"] = plots.lines(
        hz,
        x="length",
        y="delta_nats" if has_ref else "loss_nats",
        path=out / "extrapolation_horizon.png",
        unit=unit,
        logx=False,
        title="Horizon axis: streams longer than the training episodes, never reset"
        + ("\n(loss minus the same tokens evaluated with resets every T, as trained)" if has_ref else ""),
        xlabel="stream offset since the episode start (tokens)",
        ylabel=f"{'change in ' if has_ref else ''}{name}",
        vlines={"train episode T": Ts[0]} if len(Ts) == 1 else None,
        col="recurrence",
    )
    return res


# ---- the report's section ----------------------------------------------------------------------


def _sums(res: ExtrapolationResult, group: list[Run], axis: str, length: int, block: int):
    """([n_seeds, n_blocks] block sums, [n_blocks] counts) of the runs of one cell, or None."""
    from .stats import block_sums

    parts = [res.tokens.get((r.name, axis, int(length))) for r in group]
    if any(p is None for p in parts):
        return None
    sums = [block_sums(loss, mask, block) for loss, mask in parts]
    return np.stack([x for x, _ in sums]), sums[0][1]


def _interval(a, b, boot_settings, scale, same_runs: bool):
    """Bootstrap interval of the mean loss of ``a`` (``b`` None) or of ``a`` minus ``b``, each a ``_sums``
    result over the same scored blocks; empty blocks are left out."""
    from .stats import Bootstrap

    _, n_boot, level = boot_settings
    keep = a[1] > 0
    boot = Bootstrap(int(keep.sum()), n_boot, level)
    if b is None:
        return boot.mean(a[0][:, keep], a[1][keep]).scaled(scale)
    return boot.diff(a[0][:, keep], b[0][:, keep], a[1][keep], same_runs=same_runs).scaled(scale)


def _contrast(res, group, axis, la, lb, boot_settings, scale):
    """Interval of (loss at length la) - (at lb) over the same runs (or of the mean at la if lb is None)."""
    block = boot_settings[0]
    a = _sums(res, group, axis, la, block)
    b = _sums(res, group, axis, lb, block) if lb is not None else None
    if a is None or (lb is not None and b is None):
        return None
    return _interval(a, b, boot_settings, scale, same_runs=True)


def _recurrence_as_trained(runs, res, boot_settings, scale, fig, smoke, proposed) -> list[str]:
    """Memory on minus off per scheme (full loss), each run evaluated as trained on the same tokens:
    with memory, segments of L after M remembered states; without, segments of L alone. This is the
    comparison of the runs' own validation figures, made paired (the ablation table compares at equal
    attention length instead, where memory can only match a sliding window)."""
    from .runs import cells
    from .stats import sign_text, verdict

    block = boot_settings[0]
    by_cell = {(g[0].scheme, g[0].recurrence, g[0].loss, g[0].episode_len): g for g in cells(runs).values()}
    parts = []
    for (scheme, recurrence, loss, T), on in by_cell.items():
        off = by_cell.get((scheme, False, loss, T))
        if not recurrence or loss != "full" or off is None:
            continue
        a, b = _sums(res, on, "as_trained", T or 0, block), _sums(res, off, "as_trained", T or 0, block)
        if a is None or b is None or a[0].shape[1] != b[0].shape[1] or not np.array_equal(a[1], b[1]):
            continue  # not the same scored tokens: no paired comparison
        parts.append((scheme, _interval(a, b, boot_settings, scale, same_runs=False)))
    if not parts:
        return []
    mine = [iv for s, iv in parts if s == proposed]
    head = ""
    if mine:
        v = "not judged (smoke run)" if smoke else verdict(mine[0], "<0")
        head = f'Paper: "recurrence helps the {proposed} encoding", evaluated as trained: **{v}**. '
    return [
        head + "Memory on minus off, each run evaluated as trained on the same tokens (segments of L, with its "
        f"memory or without; full loss; {fig}): "
        + "; ".join(f"{s} {iv.text(3)} ({sign_text(iv)})" for s, iv in parts)
        + "."
    ]


def per_cell(summary: pd.DataFrame, runs: list[Run]) -> pd.DataFrame:
    """The summary with one row per cell: the mean over its seeds (``seeds``: how many; every run:
    extrapolation_summary.csv)."""
    from .runs import cells

    cell_of = {r.name: cell for cell, group in cells(runs).items() for r in group}
    keys = ["scheme", "recurrence", "mem_len", "loss"]
    values = [
        c
        for c in [
            "segment_at_1x",
            "segment_longest",
            "segment_at_longest",
            "segment_na_from",
            "memory_at_1x",
            "memory_longest",
            "memory_at_longest",
            "horizon_T",
            "horizon_inside",
            "horizon_past",
            "horizon_past_delta",
        ]
        if c in summary
    ]
    s = summary.assign(cell=summary["run"].map(cell_of))
    for v in values:  # e.g. segment_na_from: None where every length was applicable
        s[v] = pd.to_numeric(s[v], errors="coerce")
    out = s.groupby("cell", sort=False).agg(
        **{k: (k, "first") for k in keys}, seeds=("run", "size"), **{v: (v, "mean") for v in values}
    )
    return out.reset_index()[[*keys, "seeds", *values, "cell"]]


def section(
    runs: list[Run],
    res: ExtrapolationResult,
    s: ExtrapolationSettings,
    boot_settings: tuple[int, int, float],
    suffix: str = "",
    smoke: bool = False,
    expected_past_episodes: str | None = None,
    proposed: str | None = None,
):
    """The report's extrapolation section: the summary table, and per cell the change at the longest
    applicable length of each window axis and past the training episodes, each with its interval
    (paired block bootstrap over the same runs; boot_settings = (block, n_boot, level))."""
    from .runs import cells, figure_name, metric_of
    from .sections import Figure, Section, Table
    from .stats import sign_text, verdict

    unit = runs[0].unit
    fig = figure_name(unit)
    _, scale = metric_of(unit)
    text = (
        f"Window axis: evaluation segment length L' = {', '.join(str(f) + 'L' for f in s.segment_factors)} without "
        f"memory, and attention length M' = {', '.join(str(f) + 'M' for f in s.memory_factors)} with memory and "
        f"the same-length mask (M = L for runs trained without memory). Horizon axis: every run as trained over "
        f"streams of {s.horizon_factor} x the training episode length T, never reset; loss by stream offset, and "
        f"`horizon_past_delta`: past T, the loss minus that of the same tokens evaluated with resets every T "
        f"as in training (so the text's own difficulty cancels). Intervals: {boot_settings[2]:.0%}, paired block "
        f"bootstrap over the same tokens (and the cell's seeds). Full table (tidy, one row per run, axis and "
        f"length, with the reason where not applicable): `extrapolation/extrapolation.csv`."
    )
    summ = per_cell(res.summary, runs)
    for c in ("segment_longest", "segment_na_from", "memory_longest", "horizon_T", "seeds"):
        if c in summ:
            summ[c] = summ[c].astype("Int64")
    lines = []
    ok = res.table[res.table["status"] == "ok"]
    for axis, unit_name in (("segment", "L'"), ("memory", "M'")):
        parts = []
        for cell, group in cells(runs).items():
            a = ok[(ok["axis"] == axis) & ok["run"].isin([r.name for r in group])]
            if a.empty:
                continue
            base = a[a["factor"] == 1.0]["length"]
            longest = int(a.groupby("run")["length"].max().min())
            if base.empty or longest == int(base.iloc[0]):
                continue
            iv = _contrast(res, group, axis, longest, int(base.iloc[0]), boot_settings, scale)
            if iv is not None:
                word = {"higher": "degrades", "lower": "improves"}.get(sign_text(iv), sign_text(iv))
                parts.append(f"{cell} {iv.text(3)} at {unit_name} = {longest} ({word})")
        if parts:
            what = "Longer segments without memory" if axis == "segment" else "Longer memory M' (same-length mask)"
            lines.append(
                f"{what}, loss at the longest applicable length minus at the training length ({fig}): "
                + "; ".join(parts)
                + "."
            )
    na = res.table[res.table["status"] == NA_STATUS]
    for key, g in na.groupby(["run", "axis"], sort=False):
        lines.append(
            f"Not applicable: {key[0]}, {key[1]} axis at lengths {', '.join(map(str, g['length'].tolist()))}: "
            f"{g['reason'].iloc[0]}"
        )
    parts = []
    for cell, group in cells(runs).items():
        T = group[0].episode_len
        if T:
            iv = _contrast(res, group, "horizon_past", T, None, boot_settings, scale)
            if iv is not None:
                parts.append((group[0].scheme, cell, iv))
    if parts:
        lines.append(
            "Past the training episodes (offset >= T), loss minus the same tokens evaluated with resets "
            f"every T as in training ({fig}): "
            + "; ".join(f"{c} {iv.text(3)} ({sign_text(iv)})" for _, c, iv in parts)
            + "."
        )
        mine = [iv for sch, _, iv in parts if sch == expected_past_episodes]
        if mine:
            v = "not judged (smoke run)" if smoke else verdict(mine[0], ">0")
            lines.append(
                f'Expected: "{expected_past_episodes} degrades past its training episodes" (offsets it '
                f"never saw): **{v}**."
            )
    lines += _recurrence_as_trained(runs, res, boot_settings, scale, fig, smoke, proposed)
    tables = [
        Table(
            f"table_extrapolation{suffix}",
            summ,
            f"extrapolation summary ({fig}, mean over each cell's seeds): at the training length (1x), at the "
            f"longest applicable length, first length not applicable, and the horizon inside vs past the "
            f"training episodes",
            {c: 4 for c in summ.columns},
        )
    ]
    na_t = na[["scheme", "recurrence", "mem_len", "loss", "axis", "length", "reason", "run"]]
    if len(na_t):
        tables.append(
            Table(
                f"table_not_applicable{suffix}",
                na_t.reset_index(drop=True),
                "evaluations a scheme cannot serve, with its reason",
            )
        )
    figures = [
        Figure(
            res.figures["segment"],
            f"window axis, segment length L' without memory ({fig}; gaps = not applicable, see the table)",
        ),
        Figure(res.figures["memory"], f"window axis, attention length M' with memory ({fig})"),
        Figure(res.figures["horizon"], f"horizon axis, loss by stream offset ({fig})"),
    ]
    return Section(f"Extrapolation{' (' + suffix.strip('_') + ')' if suffix else ''}", text, tables, figures, lines)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m posenc_lab_analysis.extrapolation",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("runs", nargs="+", help="run directories or folders holding runs")
    p.add_argument("--out", required=True, type=Path)
    d = ExtrapolationSettings()
    p.add_argument("--split", default=d.split)
    p.add_argument("--n-rows", type=int, default=d.n_rows)
    p.add_argument("--segment-factors", type=_ints, default=d.segment_factors, help="L'/L, comma-separated")
    p.add_argument("--memory-factors", type=_ints, default=d.memory_factors, help="M'/M, comma-separated")
    p.add_argument("--horizon-factor", type=int, default=d.horizon_factor)
    p.add_argument("--horizon-tokens", type=int, default=d.horizon_tokens)
    add_threads_argument(p)
    a = p.parse_args(argv)
    apply_threads(a.threads)
    s = ExtrapolationSettings(
        split=a.split,
        n_rows=a.n_rows,
        segment_factors=a.segment_factors,
        memory_factors=a.memory_factors,
        horizon_factor=a.horizon_factor,
        horizon_tokens=a.horizon_tokens,
    )
    try:
        res = analyze(find_runs(a.runs), a.out, s)
    except (RunError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(res.summary.to_string(index=False))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
