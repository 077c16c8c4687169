"""The figures of the analysis: seaborn on the Agg backend, one consistent colour per scheme,
panels by recurrence (memory on / off), line style by training loss (full / half)."""

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

from .runs import metric_of, scheme_order

SCHEME_ORDER = scheme_order()
_PALETTE = dict(zip(SCHEME_ORDER, sns.color_palette("tab10", len(SCHEME_ORDER))))
sns.set_theme(style="whitegrid", context="notebook", font_scale=0.95)


def _save(fig, path: Path) -> None:
    """Save atomically (a half-written PNG is never left under the final name)."""
    write_with(path, lambda tmp: fig.savefig(tmp, dpi=110, bbox_inches="tight", format=Path(path).suffix[1:] or "png"))


def palette(schemes) -> dict:
    extra = [s for s in schemes if s not in _PALETTE]
    colours = dict(_PALETTE)
    colours.update(zip(extra, sns.color_palette("husl", max(1, len(extra)))))
    return {s: colours[s] for s in schemes}


def _ordered(values, order) -> list:
    present = list(dict.fromkeys(values))
    return [v for v in order if v in present] + [v for v in present if v not in order]


def _thin(values, min_gap: float = 0.3) -> list:
    """Tick positions on a log2 axis at least ``min_gap`` (log2 units) apart, first and last kept."""
    out = []
    for v in values:
        if not out or math.log2(v) - math.log2(out[-1]) >= min_gap:
            out.append(v)
    if values and out[-1] != values[-1]:
        out[-1] = values[-1]
    return out


def lines(
    df: pd.DataFrame,
    *,
    x: str,
    y: str,
    path: Path,
    unit: str,
    title: str,
    xlabel: str,
    logx: bool = True,
    vlines: dict[str, float] | None = None,
    col: str = "recurrence",
    ylabel: str | None = None,
    convert: bool = True,
    na: pd.DataFrame | None = None,
) -> Path:
    """Line plot of ``y`` (a loss in nats, shown in the corpus's metric) against ``x``:
    hue = scheme, style = training loss, one panel per value of ``col``. ``na``: rows (scheme,
    ``col``, ``x``) that could not be evaluated; each panel names them, so a gap is never silent."""
    name, scale = metric_of(unit)
    d = df.copy()
    if convert:
        d[y] = d[y] * scale
    d = d[np.isfinite(d[y].astype(float))]
    if d.empty:
        fig, ax = plt.subplots(figsize=(6, 3))
        ax.text(0.5, 0.5, "no applicable evaluations", ha="center", va="center")
        ax.set_axis_off()
        _save(fig, path)
        plt.close(fig)
        return path
    schemes = _ordered(d["scheme"], SCHEME_ORDER)
    cols = _ordered(d[col], ["on", "off"]) if col else None
    g = sns.relplot(
        data=d,
        x=x,
        y=y,
        hue="scheme",
        hue_order=schemes,
        palette=palette(schemes),
        style="loss" if d["loss"].nunique() > 1 else None,
        style_order=_ordered(d["loss"], ["full", "half"]) if d["loss"].nunique() > 1 else None,
        col=col,
        col_order=cols,
        kind="line",
        markers=True,
        dashes=True,
        height=3.6,
        aspect=1.25,
        facet_kws={"sharey": True, "sharex": False},
    )
    xs = sorted(d[x].unique())
    for ax in g.axes.flat:
        if logx:
            ax.set_xscale("log", base=2)
            if len(xs) <= 16:
                ticks = _thin(xs)
                ax.set_xticks(ticks, [f"{v:g}" for v in ticks])
            ax.minorticks_off()
        if vlines:
            for label, v in vlines.items():
                ax.axvline(v, color="grey", ls=":", lw=1)
                ax.text(
                    v,
                    0.01,
                    f" {label}",
                    transform=ax.get_xaxis_transform(),
                    va="bottom",
                    ha="left",
                    fontsize=8,
                    color="grey",
                )
    if na is not None and len(na):
        for key, ax in g.axes_dict.items() if col else [(None, g.ax)]:
            part = na if key is None else na[na[col] == key]
            notes = [f"{scheme}: n/a from {int(p[x].min())}" for scheme, p in part.groupby("scheme", sort=False)]
            if notes:
                ax.text(
                    0.02,
                    0.97,
                    "\n".join(notes),
                    transform=ax.transAxes,
                    fontsize=8,
                    va="top",
                    color="dimgrey",
                    bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"},
                )
    if col:
        g.set_titles(col_template="memory {col_name}" if col == "recurrence" else "{col_var} = {col_name}")
    g.set_axis_labels(xlabel, ylabel or name)
    g.figure.suptitle(title, y=1.03 + 0.06 * title.count("\n"))
    _save(g, path)
    plt.close(g.figure)
    return path


def recall_accuracy(df: pd.DataFrame, path: Path) -> Path:
    """Answer accuracy by distance on the recall probe; chance and the segment length marked."""
    schemes = _ordered(df["scheme"], SCHEME_ORDER)
    g = sns.relplot(
        data=df,
        x="distance",
        y="accuracy",
        hue="scheme",
        hue_order=schemes,
        palette=palette(schemes),
        col="recurrence",
        col_order=_ordered(df["recurrence"], ["on", "off"]),
        kind="line",
        style="loss" if df["loss"].nunique() > 1 else None,
        markers=True,
        height=3.6,
        aspect=1.25,
    )
    L = float(df["segment_len"].iloc[0])
    chance = float(df["chance"].iloc[0])
    for ax in g.axes.flat:
        if math.isfinite(chance):
            ax.axhline(chance, color="grey", ls="--", lw=1)
            ax.text(
                0.99,
                chance,
                "chance",
                transform=ax.get_yaxis_transform(),
                ha="right",
                va="bottom",
                fontsize=8,
                color="grey",
            )
        ax.axvline(L, color="grey", ls=":", lw=1)
        ax.text(L, 1.0, " segment L", transform=ax.get_xaxis_transform(), va="top", fontsize=8, color="grey")
        ax.set_ylim(0, 1.02)
    g.set_titles(col_template="memory {col_name}")
    g.set_axis_labels("distance of the planted value (tokens)", "answer accuracy")
    g.figure.suptitle("Recall probe: accuracy by distance", y=1.03)
    _save(g, path)
    plt.close(g.figure)
    return path


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
    _save(fig, path)
    plt.close(fig)
    return path


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
    _save(fig, path)
    plt.close(fig)
    return path
