"""Extrapolation: the loss of every trained run along the two axes of docs/SCHEMES.md, on held-out text.

Window axis (longer than trained):
  - segment: evaluation segment length L' = L, 2L, ..., 16L, no memory (each segment alone, its own
    episode: positions 0..L'-1), the same scored tokens for every L';
  - memory: attention length M' = M, 2M, ..., 8M (M = the training memory, L for runs without) with the
    same-length mask, segment L: every scored token attends to exactly M' previous tokens.
Horizon axis (later than trained): the run as trained (L, M) over streams of ``horizon_factor`` x its
training episode T, never reset; the loss by stream offset, and its per-token difference to the same
tokens evaluated with resets every T (``delta``): the text's own difficulty cancels.

STRING (rope's ``string_shift``, training-free): every rope run is evaluated again along both window axes with
STRING on, its shift S = ``string_shift_frac`` of the training span (M + L; L without memory) and its window
``string_window``, on the same tokens (axes ``segment+string`` and ``memory+string``), so that one checkpoint is
compared with and without it.

A length a scheme cannot serve is a row with status "not applicable" and the scheme's own reason, never a
crash and never a silent gap. Per-token values (with their documents) are kept for the intervals.

    python -m posenc_lab_analysis.extrapolation RUN_OR_FOLDER... --out DIR
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from posenc_lab.context import context_losses, stream_losses, stream_rows
from posenc_lab.metrics import figure_scale
from posenc_lab.positional import SCHEMES, scheme_options
from posenc_lab.tables import write_csv

from .runs import Run, RunError, add_threads_argument, apply_threads, find_runs
from .settings import conf_block, structured

STRING_OPTION = "string_shift"  # the scheme option that turns STRING on (rope's)
NA_STATUS = "not applicable"  # (not "n/a": pandas reads that back as a missing value)


@dataclass
class ExtrapolationSettings:
    """``ablate.analysis.extrapolation`` (its values: conf/ablate.yaml)."""

    n_rows: int
    segment_factors: list[int]  # L' / L
    memory_factors: list[int]  # M' / M
    memory_score: int | None  # scored tokens per row on the memory axis (None: 2 L)
    horizon_factor: int  # stream length / training episode length
    horizon_tokens: int  # stream length for runs trained without episodes
    horizon_bins: int
    string_shift_frac: float | None  # STRING's S as a fraction of the training span (the paper: 1/3); None: off
    string_window: int  # STRING's W (the paper's 128 is for 128K-token contexts)


@dataclass
class ExtrapolationResult:
    """table: one row per (run, axis, length); tokens: (run, axis, length) -> (values [tokens], documents
    [tokens]) of the scored tokens (horizon_past: the per-token delta past T)."""

    table: pd.DataFrame
    tokens: dict = field(default_factory=dict)
    figures: dict[str, Path] = field(default_factory=dict)


def _row(run: Run, axis: str, length: int, factor: float, loss: float | None = None, reason: str = "", **extra):
    return {
        **run.key,
        "seed": run.seed,
        "axis": axis,
        "length": int(length),
        "factor": float(factor),
        "loss_nats": float("nan") if loss is None else float(loss),
        "status": "ok" if loss is not None else NA_STATUS,
        "reason": reason,
        **extra,
    }


def _targets(run: Run, split: str, n_rows: int, row_len: int, first: int = 0):
    """(rows [n_rows, row_len + 1] tokens, units [n_rows, row_len - first] (families), scored mask [same]) of
    ``stream_rows``' layout, for the targets from position ``first`` of each row on."""
    data, side = run.split(split)
    rows = stream_rows(data, n_rows, row_len)
    stride = (len(data) - 1) // n_rows
    targets = (np.arange(n_rows) * stride)[:, None] + 1 + np.arange(first, row_len)
    scored = (
        np.asarray(side["loss_mask"])[targets].astype(bool) if "loss_mask" in side else np.ones(targets.shape, bool)
    )
    return rows, run.corpus().families(split)[targets], scored


def string_setting(run: Run, s: ExtrapolationSettings) -> tuple[int, int] | None:
    """(S, W) of STRING for ``run`` (its scheme takes ``string_shift``, and ``string_shift_frac`` is set), or None."""
    name = run.config.get("posenc", {}).get("name")
    if s.string_shift_frac is None or name not in SCHEMES or STRING_OPTION not in scheme_options(name):
        return None
    span = run.segment_len + run.mem_len
    shift = max(1, round(s.string_shift_frac * span))
    return (shift, min(s.string_window, shift - 1))


@contextmanager
def string_on(model, shift: int, window: int):
    """``model``'s rope evaluated with STRING's shift and window, restored after."""
    scheme = model.scheme
    before = scheme.string_shift, scheme.string_window
    scheme.string_shift, scheme.string_window = shift, window
    try:
        yield model
    finally:
        scheme.string_shift, scheme.string_window = before


def string_axes(run: Run, s: ExtrapolationSettings, split: str, tokens: dict) -> list[dict]:
    """Both window axes again with STRING on (a rope run), each row marked with its S and W."""
    setting = string_setting(run, s)
    if setting is None:
        return []
    with string_on(run.model(), *setting):
        rows = segment_axis(run, s, split, tokens, "segment+string") + memory_axis(
            run, s, split, tokens, "memory+string"
        )
    return [{**row, "string_shift": setting[0], "string_window": setting[1]} for row in rows]


def segment_axis(run: Run, s: ExtrapolationSettings, split: str, tokens: dict, axis: str = "segment") -> list[dict]:
    L = run.segment_len
    lengths = [f * L for f in s.segment_factors]
    rows, docs, scored = _targets(run, split, s.n_rows, max(lengths))
    out = []
    for Lp in lengths:
        try:  # each segment alone and its own episode: positions 0..L'-1 for every scheme
            loss = stream_losses(run.model(), rows, segment_len=Lp, mem_len=0, episode_len=Lp).loss.numpy()
        except ValueError as e:
            out.append(_row(run, axis, Lp, Lp / L, reason=str(e)))
            continue
        tokens[(run.name, axis, Lp)] = (loss[scored], docs[scored])
        out.append(_row(run, axis, Lp, Lp / L, loss[scored].mean()))
    return out


def memory_axis(run: Run, s: ExtrapolationSettings, split: str, tokens: dict, axis: str = "memory") -> list[dict]:
    L = run.segment_len
    M_ref = run.mem_len or L
    lengths = [f * M_ref for f in s.memory_factors]
    n_score, start = s.memory_score or 2 * L, max(lengths)
    rows, docs, scored = _targets(run, split, s.n_rows, start + n_score, first=start)
    out = []
    for Mp in lengths:
        try:
            res = context_losses(
                run.model(), rows, Mp, score_start=start, n_score=n_score, mode="memory", segment_len=L
            )
        except ValueError as e:
            out.append(_row(run, axis, Mp, Mp / M_ref, reason=str(e)))
            continue
        loss = res.loss.numpy()
        tokens[(run.name, axis, Mp)] = (loss[scored], docs[scored])
        out.append(_row(run, axis, Mp, Mp / M_ref, loss[scored].mean()))
    return out


def horizon_axis(run: Run, s: ExtrapolationSettings, split: str, tokens: dict) -> list[dict]:
    """Loss by stream offset over streams of H tokens never reset, and the per-token difference to the same
    tokens with resets every T as in training (0 inside the first episode by construction)."""
    T = run.episode_len
    H = s.horizon_factor * T if T else s.horizon_tokens
    rows, docs, scored = _targets(run, split, s.n_rows, H)
    L, M = run.segment_len, run.mem_len
    try:
        long = stream_losses(run.model(), rows, segment_len=L, mem_len=M)
        ref = stream_losses(run.model(), rows, segment_len=L, mem_len=M, episode_len=T) if T else None
    except ValueError as e:
        return [_row(run, "horizon", 0, 0.0, reason=str(e), train_horizon=T or -1)]
    loss, offsets = long.loss.numpy(), long.offset.numpy()
    delta = loss - ref.loss.numpy() if ref is not None else np.full_like(loss, np.nan)
    if T:
        past = scored & (offsets >= T)
        tokens[(run.name, "horizon_past", T)] = (delta[past], docs[past])
    width, out = max(1, H // s.horizon_bins), []
    for lo in range(0, H, width):
        sel = scored & (offsets >= lo) & (offsets < lo + width)
        if sel.any():
            out.append(
                _row(
                    run,
                    "horizon",
                    lo,
                    lo / T if T else float("nan"),
                    loss[sel].mean(),
                    train_horizon=T or -1,
                    tokens=int(sel.sum()),
                    delta_nats=float(delta[sel].mean()),
                )
            )
    return out


def analyze(runs: list[Run], out: Path, s: ExtrapolationSettings, split: str, log=print) -> ExtrapolationResult:
    """Evaluate every run along the three axes on ``split``; write extrapolation.csv into ``out`` (figures:
    the section)."""
    out.mkdir(parents=True, exist_ok=True)
    rows, tokens = [], {}
    for i, run in enumerate(runs, 1):
        log(f"  extrapolation [{i}/{len(runs)}] {run.label}")
        rows += [*segment_axis(run, s, split, tokens), *memory_axis(run, s, split, tokens)]
        rows += horizon_axis(run, s, split, tokens) + string_axes(run, s, split, tokens)
    table = pd.DataFrame(rows)
    _, scale = figure_scale(runs[0].unit)
    table["metric"] = table["loss_nats"] * scale
    if "delta_nats" in table:
        table["delta_metric"] = table["delta_nats"] * scale
    write_csv(table, out / "extrapolation.csv")
    return ExtrapolationResult(table, tokens)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m posenc_lab_analysis.extrapolation",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("runs", nargs="+", help="run directories or folders holding runs")
    p.add_argument("--out", required=True, type=Path)
    d = structured(ExtrapolationSettings, conf_block("extrapolation"), "ablate.analysis.extrapolation")
    p.add_argument("--split", default=conf_block("split"), choices=("val", "test"))
    p.add_argument("--n-rows", type=int, default=d.n_rows)
    p.add_argument("--segment-factors", type=_ints, default=d.segment_factors, help="L'/L, comma-separated")
    p.add_argument("--memory-factors", type=_ints, default=d.memory_factors, help="M'/M, comma-separated")
    p.add_argument("--horizon-factor", type=int, default=d.horizon_factor)
    p.add_argument(
        "--string-shift-frac",
        type=lambda t: None if t == "none" else float(t),
        default=d.string_shift_frac,
        help="STRING on the runs whose scheme takes it: S as a fraction of the training span ('none': off)",
    )
    p.add_argument("--string-window", type=int, default=d.string_window, help="STRING's window W")
    add_threads_argument(p)
    a = p.parse_args(argv)
    apply_threads(a.threads)
    s = replace(
        d,
        n_rows=a.n_rows,
        segment_factors=a.segment_factors,
        memory_factors=a.memory_factors,
        horizon_factor=a.horizon_factor,
        string_shift_frac=a.string_shift_frac,
        string_window=a.string_window,
    )
    try:
        res = analyze(find_runs(a.runs), a.out, s, a.split)
    except (RunError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(res.table[res.table["axis"] != "horizon"].to_string(index=False))
    print(f"wrote {a.out}/extrapolation.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
