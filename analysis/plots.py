"""The figures of the analysis: seaborn on the Agg backend, small multiples (one panel per cell, so that 15
schemes stay readable), one colour per scheme, written atomically."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from posenc_lab.io import write_with

from .runs import scheme_order

sns.set_theme(style="whitegrid", context="notebook", font_scale=0.9)


def _save(fig, path: Path) -> Path:
    """Save atomically (a half-written PNG is never left under the final name)."""
    write_with(path, lambda tmp: fig.savefig(tmp, dpi=110, bbox_inches="tight", format=Path(path).suffix[1:] or "png"))
    plt.close(fig.figure if hasattr(fig, "figure") else fig)
    return path


def palette(schemes) -> dict:
    order = scheme_order()
    known = dict(zip(order, sns.color_palette("husl", max(1, len(order)))))
    extra = [s for s in schemes if s not in known]
    known.update(zip(extra, sns.husl_palette(max(1, len(extra)), l=0.35)))  # marked or unregistered: darker, one each
    return {s: known[s] for s in schemes}


def _empty(path: Path, message: str) -> Path:
    fig, ax = plt.subplots(figsize=(6, 2))
    ax.text(0.5, 0.5, message, ha="center", va="center")
    ax.set_axis_off()
    return _save(fig, path)


def _log2(ax, values) -> None:
    ax.set_xscale("log", base=2)
    values = sorted(set(values))
    if len(values) <= 12:
        ax.set_xticks(values, [f"{v:g}" for v in values])
    ax.minorticks_off()


def small_multiples(
    df: pd.DataFrame,
    *,
    x: str,
    y: str,
    path: Path,
    title: str,
    xlabel: str,
    ylabel: str,
    logx: bool = True,
    mark: str | None = None,
    na: pd.DataFrame | None = None,
) -> Path:
    """One panel per cell (``df.cell``): the mean of ``y`` over the cell's seeds against ``x`` (line), each
    seed (dots), a vertical line at the cell's ``mark`` column (e.g. its training length). ``na``: rows
    (cell, x, reason) that could not be evaluated, named in their panel so that a gap is never silent."""
    d = df[np.isfinite(df[y].astype(float))]
    if d.empty:
        return _empty(path, "no applicable evaluations")
    cells = list(dict.fromkeys(d["cell"]))
    colours = palette(list(dict.fromkeys(d["scheme"])))
    wrap = min(4, len(cells))
    g = sns.FacetGrid(d, col="cell", col_order=cells, col_wrap=wrap, height=2.4, aspect=1.25, sharey=True, sharex=False)
    for ax, cell in zip(g.axes.flat, cells):
        part = d[d["cell"] == cell]
        colour = colours[part["scheme"].iloc[0]]
        mean = part.groupby(x)[y].mean()
        ax.plot(mean.index, mean.values, color=colour, marker="o", ms=3)
        ax.scatter(part[x], part[y], color=colour, s=6, alpha=0.5)
        if logx:
            _log2(ax, part[x])
        if mark and mark in part and np.isfinite(part[mark].iloc[0]):
            ax.axvline(part[mark].iloc[0], color="grey", ls=":", lw=1)
        if na is not None and len(na):
            gone = na[na["cell"] == cell]
            if len(gone):
                ax.text(
                    0.02,
                    0.95,
                    f"n/a from {int(gone[x].min())}",
                    transform=ax.transAxes,
                    fontsize=7,
                    va="top",
                    color="dimgrey",
                )
        ax.set_title(cell, fontsize=9)
    g.set_axis_labels(xlabel, ylabel)
    g.figure.suptitle(title, y=1.02)
    return _save(g, path)


def gain_curves(curves: pd.DataFrame, path: Path, threshold: float) -> Path:
    """RECL gain curves, one panel per cell: the gain per c (dots), its monotone fit (line) and the
    bootstrap band, one colour per r; the threshold dashed."""
    d = curves[np.isfinite(curves["gain"].astype(float))]
    if d.empty:
        return _empty(path, "no gain could be computed (one model alone has no baseline)")
    cells = list(dict.fromkeys(d["model"]))
    g = sns.FacetGrid(d, col="model", col_order=cells, col_wrap=min(4, len(cells)), height=2.4, aspect=1.25)
    colours = dict(zip(sorted(d["r"].unique()), sns.color_palette("viridis", d["r"].nunique())))
    for ax, cell in zip(g.axes.flat, cells):
        part = d[d["model"] == cell]
        for r, c in part.groupby("r"):
            ax.fill_between(c["c"], c["band_low"], c["band_high"], color=colours[r], alpha=0.2, lw=0)
            ax.plot(c["c"], c["fitted"], color=colours[r], lw=1.2, label=f"r = {r:g}")
            ax.scatter(c["c"], c["gain"], color=colours[r], s=6)
        ax.axhline(threshold, color="grey", ls="--", lw=0.8)
        ax.set_title(cell, fontsize=9)
    handles = [matplotlib.lines.Line2D([], [], color=c, label=f"r = {r:g}") for r, c in colours.items()]
    g.figure.legend(handles=handles, loc="upper right", bbox_to_anchor=(1.0, 1.0), frameon=False)
    g.set_axis_labels("context c (tokens)", "gain g(c, c + delta)")
    g.figure.suptitle("RECL gain curves (leave-one-out baseline, monotone fit, bootstrap band)", y=1.02)
    return _save(g, path)


def context_curves(curves: pd.DataFrame, path: Path, marks: dict[str, float], ylabel: str, level: float) -> Path:
    """Own-baseline truncation curves, one line per cell (``curves``: cell, scheme, memory, full_loss, c, gap, low,
    high): the loss at c minus the model's own best with its band; solid: memory c, dashed: a window of c,
    dash-dotted: another training loss; dotted verticals at ``marks`` (label -> c, e.g. L and L + M)."""
    d = curves[np.isfinite(curves["gap"].astype(float))]
    if d.empty:
        return _empty(path, "no context length was served")
    colours = palette(list(dict.fromkeys(d["scheme"])))
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for cell, part in d.groupby("cell", sort=False):
        colour, memory = colours[part["scheme"].iloc[0]], bool(part["memory"].iloc[0])
        style = ("-" if memory else "--") if bool(part["full_loss"].iloc[0]) else "-."
        ax.fill_between(part["c"], part["low"], part["high"], color=colour, alpha=0.12, lw=0)
        ax.plot(part["c"], part["gap"], color=colour, ls=style, marker="o", ms=3, label=cell)
    for label, c in marks.items():
        ax.axvline(c, color="grey", ls=":", lw=1)
        ax.text(c, 1.0, f" {label}", transform=ax.get_xaxis_transform(), fontsize=8, va="top", color="dimgrey")
    ax.set_xscale("log", base=2)
    ticks = sorted({int(c) for c in d["c"] if int(c) & (int(c) - 1) == 0} | {int(c) for c in marks.values()})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_yscale("symlog", linthresh=0.01)
    ax.set_xlabel("context c (tokens seen by every scored token)")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7, frameon=False, bbox_to_anchor=(1.01, 1), loc="upper left")
    ax.set_title(f"Loss at context c minus the model's own best (band: {level:.0%} over seeds and units)", fontsize=10)
    return _save(fig, path)


def recall_accuracy(df: pd.DataFrame, path: Path) -> Path:
    """Answer accuracy by distance on the recall probe, one panel per cell; chance and the segment length marked."""
    cells = list(dict.fromkeys(df["cell"]))
    colours = palette(list(dict.fromkeys(df["scheme"])))
    g = sns.FacetGrid(df, col="cell", col_order=cells, col_wrap=min(4, len(cells)), height=2.4, aspect=1.25)
    for ax, cell in zip(g.axes.flat, cells):
        part = df[df["cell"] == cell]
        colour = colours[part["scheme"].iloc[0]]
        mean = part.groupby("distance")["accuracy"].mean()
        ax.plot(mean.index, mean.values, color=colour, marker="o", ms=3)
        chance = float(part["chance"].iloc[0])
        if math.isfinite(chance):
            ax.axhline(chance, color="grey", ls="--", lw=0.8)
        ax.axvline(float(part["segment_len"].iloc[0]), color="grey", ls=":", lw=1)
        ax.set_ylim(0, 1.02)
        ax.set_title(cell, fontsize=9)
    g.set_axis_labels("distance of the planted value (tokens)", "answer accuracy")
    g.figure.suptitle("Recall probe: accuracy by distance (dotted: segment L; dashed: chance)", y=1.02)
    return _save(g, path)


def reach_heatmap(bins: pd.DataFrame, reach: pd.DataFrame, marks: dict[str, int], path: Path) -> Path:
    """Recall accuracy by distance bin (columns, (lo, hi]) and cell (rows); a white tick at each cell's reach,
    dotted lines at the reference distances ``marks`` (L, L + M, ...). ``bins``: cell, bin_lo, bin_hi, accuracy;
    ``reach``: cell, reach_estimate."""
    cells = list(dict.fromkeys(bins["cell"]))
    width = int((bins["bin_hi"] - bins["bin_lo"]).iloc[0])
    first, last = int(bins["bin_lo"].min()), int(bins["bin_hi"].max())
    columns = list(range(first + width, last + 1, width))  # every bin, those without answers blank
    grid = bins.pivot_table(index="cell", columns="bin_hi", values="accuracy").reindex(index=cells, columns=columns)
    fig, ax = plt.subplots(figsize=(min(18, 2.5 + 0.3 * len(columns)), 1.4 + 0.32 * len(cells)))
    sns.heatmap(grid, vmin=0, vmax=1, cmap="viridis", ax=ax, cbar_kws={"label": "answer accuracy (seeds' mean)"})
    step = max(1, len(columns) // 16)
    ax.set_xticks(np.arange(0, len(columns), step) + 0.5, [str(c) for c in columns[::step]], rotation=0, fontsize=7)
    x = lambda d: (d - first) / width  # noqa: E731 - distance -> heatmap x (column i spans (lo_i, hi_i])
    at: dict[int, list[str]] = {}
    for name, d in marks.items():
        if first < d <= last:
            at.setdefault(d, []).append(name)
    for d in at:
        ax.axvline(x(d), color="white", ls=":", lw=1)
    top = ax.twiny()  # the reference distances named on a top axis, off the cells
    top.set_xlim(ax.get_xlim())
    top.set_xticks([x(d) for d in at], [", ".join(n) for n in at.values()], fontsize=7, rotation=25, ha="left")
    top.grid(False)
    for i, cell in enumerate(cells):
        r = reach.loc[reach["cell"] == cell, "reach_estimate"]
        if len(r) and int(r.iloc[0]) > 0:
            ax.plot([x(int(r.iloc[0]))] * 2, [i + 0.1, i + 0.9], color="white", lw=2.5)
    ax.set_xlabel(f"distance D of the planted value (bins of {width}, upper end shown)")
    ax.set_ylabel("")
    ax.set_title("Retrieval reach: accuracy by distance (white tick: reach; dotted: reference distances)", pad=28)
    return _save(fig, path)


def attention_heatmaps(mass: pd.DataFrame, path: Path, max_columns: int = 48) -> Path:
    """One heatmap per run: rows layer/head, columns distance d = i - j, colour = attention mass per
    key at that distance (log scale; averaged within a bin where distances are binned, so bins of
    different widths compare). The dotted line marks d = L: keys that far back are reachable only
    through the memory. ``mass``: run, label, layer, head, distance, mass, mem_len."""
    runs = list(dict.fromkeys(mass["run"]))
    n = len(runs)
    ncol = 2 if n > 1 else 1
    nrow = math.ceil(n / ncol)
    dmax = int(mass["distance"].max())
    if dmax + 1 <= max_columns:
        edges = np.arange(dmax + 2)
    else:  # exact near, log-spaced far
        L = int(mass["segment_len"].iloc[0]) if "segment_len" in mass else dmax + 1
        edges = np.unique(
            np.concatenate(
                [
                    np.arange(8),
                    np.geomspace(8, dmax + 1, max_columns - 8).round().astype(int),
                    [min(L, dmax + 1), dmax + 1],
                ]
            )
        )
    heads = mass.groupby("run")[["layer", "head"]].apply(lambda d: len(d.drop_duplicates())).max()
    fig, axes = plt.subplots(nrow, ncol, figsize=(6.4 * ncol, (0.22 * heads + 1.3) * nrow), squeeze=False)
    norm = matplotlib.colors.LogNorm(vmin=1e-4, vmax=1.0)
    image = None
    for ax, run in zip(axes.flat, runs):
        d = mass[mass["run"] == run]
        layers, hs = sorted(d["layer"].unique()), sorted(d["head"].unique())
        grid = np.zeros((len(layers) * len(hs), dmax + 1))
        for (layer, head), g in d.groupby(["layer", "head"]):
            grid[layers.index(layer) * len(hs) + hs.index(head), g["distance"].to_numpy()] = g["mass"].to_numpy()
        binned = np.stack([grid[:, a:b].mean(axis=1) for a, b in zip(edges[:-1], edges[1:])], axis=1)
        image = ax.pcolormesh(
            np.arange(len(edges)),
            np.arange(grid.shape[0] + 1),
            np.clip(binned, 1e-4, None),
            norm=norm,
            cmap="viridis",
            shading="flat",
        )
        ax.invert_yaxis()
        ax.set_yticks(np.arange(grid.shape[0]) + 0.5, [f"L{layer} H{h}" for layer in layers for h in hs], fontsize=7)
        step = max(1, len(edges) // 12)
        ticks = list(range(0, len(edges) - 1, step))
        ax.set_xticks(np.array(ticks) + 0.5, [str(edges[t]) for t in ticks], fontsize=7)
        L = int(d["segment_len"].iloc[0]) if "segment_len" in d else None
        if L is not None and L <= dmax:
            x = np.searchsorted(edges, L)
            ax.axvline(x, color="white", ls=":", lw=1.2)
        ax.set_title(str(d["label"].iloc[0]), fontsize=10)
        ax.set_xlabel("distance i - j (tokens" + (", binned" if len(edges) < dmax + 2 else "") + ")", fontsize=8)
        ax.grid(False)
    for ax in list(axes.flat)[n:]:
        ax.set_axis_off()
    fig.suptitle("Where the models look: attention mass per key by distance (dotted: d = L, memory beyond)", y=1.0)
    fig.tight_layout()
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.6, label="attention mass per key")
    return _save(fig, path)


def _log2_lengths(ax, lens: list) -> None:
    """A log-2 x axis ticked at exactly the measured attention lengths."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(lens, [str(v) for v in lens])
    ax.minorticks_off()


def eval_speed(df: pd.DataFrame, path: Path) -> Path:
    """Tokens/s against attention length, memory reuse vs sliding window, and the speed-up."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    sns.lineplot(data=df, x="attn_len", y="tokens_per_s", hue="method", marker="o", ax=a1)
    lens = sorted(df["attn_len"].unique())
    _log2_lengths(a1, lens)
    a1.set_yscale("log")
    a1.set_xlabel("attention length (tokens)")
    a1.set_ylabel("evaluation tokens/s")
    wide = df.pivot_table(index="attn_len", columns="method", values="tokens_per_s")
    if {"memory", "sliding window"} <= set(wide.columns):
        speedup = (wide["memory"] / wide["sliding window"]).reset_index(name="speedup")
        sns.lineplot(data=speedup, x="attn_len", y="speedup", marker="o", ax=a2, color="C2")
        for _, r in speedup.iterrows():
            a2.annotate(
                f"{r['speedup']:.0f}x",
                (r["attn_len"], r["speedup"]),
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
                fontsize=8,
            )
    _log2_lengths(a2, lens)
    a2.set_xlabel("attention length (tokens)")
    a2.set_ylabel("speed-up of memory reuse")
    fig.suptitle("Evaluation speed: memory reuse vs recomputing a sliding window")
    fig.tight_layout()
    return _save(fig, path)


def context_use(curves: pd.DataFrame, path: Path, marks: dict[str, float], ylabel: str, level: float) -> Path:
    """use(d), the loss with the context beyond d replaced minus the true loss, one line per cell with its band,
    a panel per token set (``curves``: cell, scheme, memory, tokens, d, use, low, high); dotted verticals at
    ``marks`` (label -> d); d = 0 (the whole memory replaced) sits at the left end of a symlog axis."""
    d = curves[np.isfinite(curves["use"].astype(float))]
    if d.empty:
        return _empty(path, "no perturbed evaluation")
    sets = list(dict.fromkeys(d["tokens"]))
    colours = palette(list(dict.fromkeys(d["scheme"])))
    fig, axes = plt.subplots(1, len(sets), figsize=(6.5 * len(sets), 4.2), squeeze=False, sharey=True)
    for ax, name in zip(axes[0], sets):
        for cell, part in d[d["tokens"] == name].groupby("cell", sort=False):
            colour = colours[part["scheme"].iloc[0]]
            ax.fill_between(part["d"], part["low"], part["high"], color=colour, alpha=0.12, lw=0)
            ax.plot(part["d"], part["use"], color=colour, ls="-" if part["memory"].iloc[0] else "--", marker="o", ms=3,
                    label=cell)  # fmt: skip
        ax.axhline(0, color="black", lw=0.8)
        for label, x in marks.items():
            ax.axvline(x, color="grey", ls=":", lw=1)
            ax.text(x, 1.0, f" {label}", transform=ax.get_xaxis_transform(), fontsize=8, va="top", color="dimgrey")
        ax.set_xscale("symlog", base=2, linthresh=2)
        ax.set_xlim(left=-0.2)
        ticks = sorted({int(x) for x in d["d"] if int(x) & (int(x) - 1) == 0} | {int(x) for x in marks.values()})
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_yscale("symlog", linthresh=0.01)
        ax.set_xlabel("d (inputs kept true before each scored token, at least)")
        ax.set_title(f"{name} (band: {level:.0%} over seeds and units)", fontsize=10)
    axes[0][0].set_ylabel(ylabel)
    axes[0][-1].legend(fontsize=7, frameon=False, bbox_to_anchor=(1.01, 1), loc="upper left")
    return _save(fig, path)


def training_distances(freq: pd.DataFrame, path: Path) -> Path:
    """The share of training's (query, key) pairs at each distance, one line per training setting (``freq``: cell,
    distance, share; cells of one setting drawn once, named together): STRING's left-skewed frequency."""
    if freq.empty:
        return _empty(path, "no run")
    shapes = {}
    for cell, part in freq.groupby("cell", sort=False):
        shapes.setdefault(tuple(part["share"].round(12)), (part, []))[1].append(cell)
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    for part, cells in shapes.values():
        label = ", ".join(cells[:3]) + (f" and {len(cells) - 3} more" if len(cells) > 3 else "")
        ax.plot(part["distance"], part["share"], marker=".", ms=3, label=label)
    ax.set_xlabel("distance d = i - j (tokens)")
    ax.set_ylabel("share of training pairs")
    ax.legend(fontsize=7, frameon=False, bbox_to_anchor=(1.01, 1), loc="upper left")
    ax.set_title("How often training scores each distance (the largest are the rarest)", fontsize=10)
    return _save(fig, path)
