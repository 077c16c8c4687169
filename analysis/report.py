"""The ablation report: one Markdown file with embedded PNGs and every table's CSV beside it,
shaped like the Transformer-XL ablation (Table 6): scheme x recurrence x training loss, the
loss at the training attention length ("init"), the best over evaluation attention lengths and
that length, RECL, the extrapolation figures and the attention spans.

The text under each table is computed from that table's numbers (comparisons, rankings and the
paper's findings checked one by one); nothing in it is written in advance.

    python -m analysis.report RUNS_DIR [RUNS_DIR...] --out DIR
RUNS_DIR: run directories or folders holding runs, e.g. a Hydra multirun folder
(runs/multirun/DATE/TIME) or an ablation's runs/ folder.
"""

from __future__ import annotations

import argparse
import datetime
import math
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from . import attention_span, effective_context, eval_speed, extrapolation
from .runs import Run, RunError, add_threads_argument, apply_threads, figure_name, find_runs, metric_of

# Differences smaller than this (in bits per byte/char, or nats per word) are called "no difference".
TOL = 0.005


@dataclass
class ReportSettings:
    context: effective_context.ContextSettings = field(default_factory=effective_context.ContextSettings)
    extrapolation: extrapolation.ExtrapolationSettings = field(default_factory=extrapolation.ExtrapolationSettings)
    attention: attention_span.AttentionSettings = field(default_factory=attention_span.AttentionSettings)
    speed_attn_lens: tuple[int, ...] = (64, 128, 256, 512)
    speed_batch: int = 4
    speed_min_seconds: float = 0.5
    recall_rows: int = 16
    recall_tokens: int = 4096
    split: str = "valid"
    device: str = "cpu"  # where the analyses run the models: cpu, cuda, auto

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ReportSettings":
        """From the ``ablate.analysis`` block of conf/ablate.yaml."""
        split = d.get("split", "valid")
        ctx = {k: v for k, v in (d.get("context") or {}).items()}
        ext = {k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in (d.get("extrapolation") or {}).items()}
        att = dict(d.get("attention") or {})
        speed = d.get("speed") or {}
        recall = d.get("recall") or {}
        return cls(context=effective_context.ContextSettings(split=split, **ctx),
                   extrapolation=extrapolation.ExtrapolationSettings(split=split, **ext),
                   attention=attention_span.AttentionSettings(split=split, **att),
                   speed_attn_lens=tuple(speed.get("attn_lens", cls.speed_attn_lens)),
                   speed_batch=int(speed.get("batch", cls.speed_batch)),
                   speed_min_seconds=float(speed.get("min_seconds", cls.speed_min_seconds)),
                   recall_rows=int(recall.get("n_rows", cls.recall_rows)),
                   recall_tokens=int(recall.get("n_tokens", cls.recall_tokens)), split=split,
                   device=str(d.get("device") or "cpu"))


# ---- formatting --------------------------------------------------------------------------------

def _cell(v: Any, decimals: int) -> str:
    if v is None or v is pd.NA or (isinstance(v, (float, np.floating)) and not math.isfinite(v)):
        return "n/a"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.{decimals}f}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def md_table(df: pd.DataFrame, decimals: dict[str, int] | None = None, default: int = 4) -> str:
    """A Markdown table of ``df`` with the same columns (and order) as its CSV."""
    decimals = decimals or {}
    head = "| " + " | ".join(df.columns) + " |"
    sep = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(_cell(v, decimals.get(c, default)) for c, v in zip(df.columns, row)) + " |"
            for row in df.itertuples(index=False)]
    return "\n".join([head, sep, *body])


def _fmt(x: float, d: int = 3) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.{d}f}"


def _who(row) -> str:
    return f"{row['scheme']} (memory {row['recurrence']}, {row['loss']} loss)"


class Report:
    """Collects sections; tables are written as CSV and rendered from the same DataFrame."""

    def __init__(self, out: Path):
        self.out = out
        self.parts: list[str] = []
        self.tables: dict[str, Path] = {}
        self.figures: dict[str, Path] = {}

    def h(self, level: int, text: str) -> None:
        self.parts.append(f"{'#' * level} {text}\n")

    def p(self, text: str) -> None:
        self.parts.append(text.strip() + "\n")

    def bullets(self, items: list[str]) -> None:
        if items:
            self.parts.append("\n".join(f"- {i}" for i in items) + "\n")

    def table(self, name: str, df: pd.DataFrame, caption: str, decimals: dict[str, int] | None = None) -> None:
        path = self.out / f"{name}.csv"
        df.to_csv(path, index=False)
        self.tables[name] = path
        self.parts.append(f"**Table: {caption}** ([{path.name}]({path.name}))\n\n{md_table(df, decimals)}\n")

    def figure(self, name: str, path: Path, caption: str) -> None:
        rel = path.relative_to(self.out) if path.is_relative_to(self.out) else path
        self.figures[name] = path
        self.parts.append(f"![{caption}]({rel.as_posix()})\n\n*Figure: {caption}*\n")

    def write(self) -> Path:
        path = self.out / "report.md"
        path.write_text("\n".join(self.parts))
        return path


# ---- section builders (each computes its text from its table) --------------------------------------

def ablation_table(runs: list[Run], lbc: pd.DataFrame, recl: pd.DataFrame | None, unit: str) -> pd.DataFrame:
    """Table 6: one row per run. Attention length A = every scored token sees exactly A previous tokens
    (memory A with the same-length mask for runs trained with memory, a sliding window of A tokens for
    runs without), on the same tokens for every run and A. init: at the training attention length
    (M with memory, L without); best: the lowest over the evaluated A, and that A."""
    _, scale = metric_of(unit)
    fig = figure_name(unit)
    rows = []
    for run in runs:
        a = lbc[(lbc["run"] == run.name) & np.isfinite(lbc["loss_nats"])]
        train_len = effective_context.train_attention_length(run)
        init = a[a["c"] == train_len]
        row = {"scheme": run.scheme, "recurrence": "on" if run.recurrence else "off", "loss": run.loss,
               "mem_len": run.mem_len, "segment_len": run.segment_len,
               f"val_{fig}": np.nan, "eval_mode": effective_context.run_mode(run, "auto"),
               "train_attn_len": train_len,
               f"init_{fig}": float(init["loss_nats"].iloc[0]) * scale if len(init) else np.nan,
               f"best_{fig}": np.nan, "best_attn_len": None}
        val = (run.results or {}).get("val") or {}
        if "loss" in val:
            row[f"val_{fig}"] = float(val["loss"]) * scale
        if len(a):
            best = a.loc[a["loss_nats"].idxmin()]
            row[f"best_{fig}"] = float(best["loss_nats"]) * scale
            row["best_attn_len"] = int(best["c"])
        if recl is not None:
            for r in effective_context.R_VALUES:
                hit = recl[(recl["run"] == run.name) & (recl["r"] == r)]
                row[f"recl_r{r:g}"] = _recl_cell(hit)
        row["run"] = run.name
        rows.append(row)
    df = pd.DataFrame(rows)
    df["best_attn_len"] = df["best_attn_len"].astype("Int64")
    return df


def _recl_cell(hit: pd.DataFrame) -> str:
    if hit.empty:
        return "n/a"
    h = hit.iloc[0]
    return effective_context.recl_text(h["recl"], bool(h["censored"]), bool(h.get("limited", False)))


def recl_table(recl: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for run, g in recl.groupby("run", sort=False):
        first = g.iloc[0]
        row = {k: first[k] for k in ("scheme", "recurrence", "mem_len", "loss", "mode")}
        for r in effective_context.R_VALUES:
            row[f"recl_r{r:g}"] = _recl_cell(g[g["r"] == r])
        row["run"] = run
        rows.append(row)
    return pd.DataFrame(rows)


def ablation_findings(t: pd.DataFrame, unit: str) -> list[str]:
    fig = figure_name(unit)
    init, best = f"init_{fig}", f"best_{fig}"
    lines = []
    ok = t[np.isfinite(t[init])]
    if ok.empty:
        return ["No run could be evaluated at its training attention length."]
    top = ok.loc[ok[init].idxmin()]
    lines.append(f"Lowest {fig} at the training attention length: {_who(top)}, {top[init]:.3f} "
                 f"(worst: {_who(ok.loc[ok[init].idxmax()])}, {ok[init].max():.3f}).")
    # Paper finding 1: XL + recurrence is best.
    xl_on = ok[(ok["scheme"] == "xl") & (ok["recurrence"] == "on")]
    if len(xl_on):
        xl_best = xl_on[best].min()
        others = ok[~((ok["scheme"] == "xl") & (ok["recurrence"] == "on"))]
        if len(others):
            rival = others.loc[others[best].idxmin()]
            verdict = "reproduced" if xl_best < rival[best] - TOL else (
                "not separable at this scale" if abs(xl_best - rival[best]) <= TOL else "not reproduced")
            lines.append(f"Paper: \"XL encoding with recurrence is best\": {verdict} here (xl with memory, best "
                         f"{xl_best:.3f} vs the best other row, {_who(rival)}, {rival[best]:.3f}).")
    # Memory on vs off per scheme (full loss), each at its training attention length.
    diffs = []
    for scheme, g in ok[ok["loss"] == "full"].groupby("scheme", sort=False):
        on, off = g[g["recurrence"] == "on"], g[g["recurrence"] == "off"]
        if len(on) and len(off):
            diffs.append((scheme, on[init].min() - off[init].min()))
    if diffs:
        helped = [f"{s} ({d:+.3f})" for s, d in diffs if d < -TOL]
        hurt = [f"{s} ({d:+.3f})" for s, d in diffs if d > TOL]
        same = [f"{s} ({d:+.3f})" for s, d in diffs if abs(d) <= TOL]
        lens = sorted(set(ok["train_attn_len"].astype(int)))
        lines.append(f"Memory (init, on minus off, full loss; attention length {'/'.join(map(str, lens))}): "
                     + "; ".join(x for x in (f"helps {', '.join(helped)}" if helped else "",
                                             f"hurts {', '.join(hurt)}" if hurt else "",
                                             f"no difference beyond {TOL} for {', '.join(same)}" if same else "") if x)
                     + ".")
    # Paper finding 2: absolute encodings need the half loss (with memory).
    half_rows = []
    for scheme, g in ok[ok["recurrence"] == "on"].groupby("scheme", sort=False):
        full, half = g[g["loss"] == "full"], g[g["loss"] == "half"]
        if len(full) and len(half):
            half_rows.append((scheme, half[init].min() - full[init].min()))
    if half_rows:
        absolute = [(s, d) for s, d in half_rows if s in ("sinusoid", "learned", "global_sinusoid")]
        txt = ", ".join(f"{s} {d:+.3f}" for s, d in half_rows)
        if absolute:
            n_help = sum(d < -TOL for _, d in absolute)
            verdict = ("reproduced" if n_help == len(absolute) else "partly reproduced" if n_help else "not reproduced")
            lines.append(f"Half loss minus full loss at the training length, with memory: {txt}. Paper: \"absolute "
                         f"encodings need the half loss\": {verdict} ({n_help} of {len(absolute)} absolute schemes "
                         f"gain more than {TOL}).")
        else:
            lines.append(f"Half loss minus full loss at the training length, with memory: {txt}.")
    # Paper finding 3: a longer evaluation attention helps only the XL encoding.
    gain = ok[best] - ok[init]
    longer = ok[(gain < -TOL) & (ok["best_attn_len"].astype(float) > ok["train_attn_len"].astype(float))]
    if len(longer):
        lines.append("A longer evaluation attention than in training lowers the loss by more than "
                     f"{TOL} for: " + "; ".join(f"{_who(r)} ({r[init]:.3f} -> {r[best]:.3f} at {int(r['best_attn_len'])})"
                                               for _, r in longer.iterrows()) + ".")
    else:
        lines.append(f"No run gains more than {TOL} from a longer evaluation attention than in training.")
    mem_rows = ok[ok["recurrence"] == "on"]
    if len(mem_rows):
        gainers = sorted(set(longer[longer["recurrence"] == "on"]["scheme"]))
        if not gainers:
            verdict = "not reproduced: no run with memory gains from a longer evaluation attention"
        elif gainers == ["xl"]:
            verdict = "reproduced: among the runs with memory only xl gains"
        elif "xl" in gainers:
            verdict = f"partly reproduced: xl gains, and so do {', '.join(g for g in gainers if g != 'xl')}"
        else:
            verdict = f"not reproduced: {', '.join(gainers)} gain(s), xl does not"
        lines.append(f"Paper: \"a longer evaluation attention helps only the XL encoding\": {verdict}.")
    return lines


def recl_findings(t: pd.DataFrame) -> list[str]:
    lines = []
    t = t.copy()
    t["recl"] = pd.to_numeric(t["recl"], errors="coerce")
    for r in effective_context.R_VALUES:
        g = t[(t["r"] == r) & t["recl"].notna()]
        if g.empty:
            continue
        top, low = g["recl"].max(), g["recl"].min()
        if top == low:
            lines.append(f"r = {r:g}: every run has RECL {int(top)}{' (above the grid)' if g['censored'].all() else ''}.")
            continue
        leaders = g[g["recl"] == top]
        cens = any(leaders["censored"])
        lows = g[g["recl"] == low]
        low_txt = (", ".join(_who(x) for _, x in lows.iterrows()) if len(lows) <= 3
                   else f"{len(lows)} of the {len(g)} runs")
        lines.append(f"r = {r:g}: largest RECL {'>' if cens else ''}{int(top)} tokens for "
                     + ", ".join(_who(x) for _, x in leaders.iterrows()) + f"; smallest {int(low)} for {low_txt}.")
    full = t[(t["loss"] == "full") & (t["r"] == 0.1) & t["recl"].notna()]
    pairs = []
    for scheme, g in full.groupby("scheme", sort=False):
        on, off = g[g["recurrence"] == "on"], g[g["recurrence"] == "off"]
        if len(on) and len(off):
            pairs.append(f"{scheme} {int(on['recl'].max())} vs {int(off['recl'].max())}")
    if pairs:
        lines.append("RECL (r = 0.1) with vs without memory: " + "; ".join(pairs) + ".")
    if t["censored"].any():
        lines.append("'>c': the gain stayed above the threshold up to the largest context tested, so the true RECL "
                     "is larger than the grid shows.")
    if "limited" in t and t["limited"].any():
        names = sorted({x["scheme"] for _, x in t[t["limited"]].iterrows()})
        lines.append(f"'(limit)': {', '.join(names)} cannot be evaluated at the next context length (see the "
                     f"not-applicable table), so its RECL stops where its reach does.")
    return lines


def extrapolation_findings(summary: pd.DataFrame, table: pd.DataFrame, unit: str) -> list[str]:
    fig = figure_name(unit)
    lines = []
    seg = summary.dropna(subset=["segment_at_1x", "segment_at_longest"])
    if len(seg):
        d = seg["segment_at_longest"] - seg["segment_at_1x"]
        worse = seg[d > TOL].assign(delta=d[d > TOL]).sort_values("delta", ascending=False)
        better = seg[d < -TOL]
        if len(worse):
            lines.append(f"Longer segments without memory (L' up to {int(seg['segment_longest'].max())}): "
                         + "; ".join(f"{_who(r)} degrades {r['segment_at_1x']:.3f} -> {r['segment_at_longest']:.3f} "
                                     f"{fig} at L' = {int(r['segment_longest'])}" for _, r in worse.iterrows()) + ".")
        if len(better):
            lines.append("Improve with longer segments: " + "; ".join(
                f"{_who(r)} {r['segment_at_1x']:.3f} -> {r['segment_at_longest']:.3f}" for _, r in better.iterrows()) + ".")
    mem = summary.dropna(subset=["memory_at_1x", "memory_at_longest"])
    if len(mem):
        d = mem["memory_at_longest"] - mem["memory_at_1x"]
        worse, better = mem[d > TOL], mem[d < -TOL]
        parts = []
        if len(worse):
            parts.append("degrades for " + "; ".join(f"{_who(r)} ({r['memory_at_1x']:.3f} -> {r['memory_at_longest']:.3f})"
                                                     for _, r in worse.iterrows()))
        if len(better):
            parts.append("helps " + "; ".join(f"{_who(r)} ({r['memory_at_1x']:.3f} -> {r['memory_at_longest']:.3f})"
                                              for _, r in better.iterrows()))
        flat = len(mem) - len(worse) - len(better)
        if flat:
            parts.append(f"changes the loss by at most {TOL} for {flat} run(s)")
        lines.append(f"Longer memory M' (up to {int(mem['memory_longest'].max())}, same-length mask): " + "; ".join(parts) + ".")
    na = table[table["status"] == extrapolation.NA_STATUS]
    for key, g in na.groupby(["run", "axis"], sort=False):
        lines.append(f"Not applicable: {key[0]}, {key[1]} axis at lengths {', '.join(map(str, g['length'].tolist()))}: "
                     f"{g['reason'].iloc[0]}")
    if "horizon_past_delta" in summary:
        hz = summary.dropna(subset=["horizon_past_delta"])
        if len(hz):
            d = hz["horizon_past_delta"]
            worse, better = hz[d > TOL], hz[d < -TOL]
            parts = []
            if len(worse):
                parts.append("worse for " + "; ".join(
                    f"{_who(r)} by {r['horizon_past_delta']:+.3f} (at the farthest offsets {r['horizon_last_delta']:+.3f})"
                    for _, r in worse.sort_values("horizon_past_delta", ascending=False).iterrows()))
            if len(better):
                parts.append("better for " + "; ".join(f"{_who(r)} by {r['horizon_past_delta']:+.3f}"
                                                      for _, r in better.iterrows())
                             + " (the memory is never reset, so tokens after an episode boundary keep their context)")
            if len(hz) - len(worse) - len(better):
                parts.append(f"within {TOL} for the other {len(hz) - len(worse) - len(better)} run(s)")
            lines.append(f"Past the training episodes (offset >= T), against the same tokens evaluated with resets "
                         f"every T as in training, the loss is " + "; ".join(parts) + ".")
    return lines


def attention_findings(s: pd.DataFrame) -> list[str]:
    lines = []
    if s.empty:
        return lines
    far = s.loc[s["mean_distance"].idxmax()]
    near = s.loc[s["mean_distance"].idxmin()]
    lines.append(f"Mean attended distance (over layers and heads): longest {far['mean_distance']:.1f} tokens for "
                 f"{_who(far)}, shortest {near['mean_distance']:.1f} for {_who(near)}.")
    mem = s[s["recurrence"] == "on"]
    if len(mem):
        top = mem.loc[mem["memory_share"].idxmax()]
        low = mem.loc[mem["memory_share"].idxmin()]
        lines.append(f"Share of attention on the memory: highest {top['memory_share']:.1%} ({_who(top)}), lowest "
                     f"{low['memory_share']:.1%} ({_who(low)}).")
        beyond = mem.sort_values("beyond_L_share", ascending=False)
        lines.append("Mass at distances >= L (beyond one segment), runs with memory: " + ", ".join(
            f"{r['scheme']}{'' if r['loss'] == 'full' else ' (' + r['loss'] + ')'} {r['beyond_L_share']:.1%}"
            for _, r in beyond.iterrows()) + ".")
    return lines


def speed_findings(df: pd.DataFrame) -> list[str]:
    mem = df[df["method"] == "memory"].sort_values("attn_len")
    if mem.empty:
        return []
    parts = ", ".join(f"{r['speedup']:.0f}x at {int(r['attn_len'])}" for _, r in mem.iterrows())
    return [f"Memory reuse against a recomputed sliding window: {parts} (paper, GPU: 363x at 800 to 1,874x at 3,800). "
            f"The speed-up grows with the attention length, since a window costs a forward pass of A + 1 tokens per "
            f"predicted token." if mem["speedup"].is_monotonic_increasing else
            f"Memory reuse against a recomputed sliding window: {parts} (paper, GPU: 363x at 800 to 1,874x at 3,800)."]


def recall_table(acc: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for key, g in acc.groupby(["run", "scheme", "recurrence", "mem_len", "loss"], sort=False):
        L = int(g["segment_len"].iloc[0])
        within = g[g["bin_lo"] + effective_context.DISTANCE_BIN <= L]  # bins entirely below L
        beyond = g[g["bin_lo"] >= L]
        w = lambda d: float(np.average(d["accuracy"], weights=d["answers"])) if len(d) else np.nan  # noqa: E731
        rows.append({"scheme": key[1], "recurrence": key[2], "mem_len": key[3], "loss": key[4],
                     "acc_within_L": w(within), "acc_beyond_L": w(beyond), "chance": float(g["chance"].iloc[0]),
                     "answers": int(g["answers"].sum()), "segment_len": L, "run": key[0]})
    return pd.DataFrame(rows)


def recall_findings(t: pd.DataFrame) -> list[str]:
    lines = []
    ok = t[np.isfinite(t["acc_beyond_L"])]
    if len(ok):
        top = ok.loc[ok["acc_beyond_L"].idxmax()]
        above = ok[ok["acc_beyond_L"] > 2 * ok["chance"]]
        lines.append(f"Beyond one segment, {_who(top)} answers best ({top['acc_beyond_L']:.1%}); "
                     f"{len(above)} of {len(ok)} runs exceed twice chance there"
                     + (f": {', '.join(_who(r) for _, r in above.iterrows())}." if len(above) else "."))
    for _, r in t.iterrows():
        ratio = r["acc_beyond_L"] / r["chance"] if r["chance"] > 0 and np.isfinite(r["acc_beyond_L"]) else np.nan
        lines.append(f"{_who(r)}: {r['acc_within_L']:.1%} within one segment, {r['acc_beyond_L']:.1%} beyond it "
                     f"({ratio:.1f}x chance {r['chance']:.1%}).")
    return lines


# ---- the report ---------------------------------------------------------------------------------

def _settings_line(runs: list[Run]) -> str:
    r = runs[0]
    m = r.config["model"]
    steps = sorted({int((x.results or {}).get("steps") or x.config["trainer"].get("max_steps") or 0) for x in runs})
    T = r.episode_len
    return (f"corpus `{r.corpus_name}` ({r.unit} level), model {m['n_layer']} layers x d_model {m['d_model']} "
            f"({m['n_head']} heads), segment L = {r.segment_len}, memory M = "
            f"{', '.join(str(v) for v in sorted({x.mem_len for x in runs if x.mem_len})) or 'none'}, training episodes "
            f"T = {T if T else 'whole stream'}, batch {r.config['data']['batch_size']}, "
            f"{', '.join(map(str, steps))} steps, lr {r.config.get('optim', {}).get('lr')}")


def build_report(runs: list[Run], out: Path, settings: ReportSettings | None = None, title: str = "posenc-lab ablation",
                 meta: dict[str, Any] | None = None, log: Callable[[str], None] = print,
                 speed: bool = True) -> Path:
    """Run every analysis on ``runs`` and write ``out/report.md`` with its CSVs and PNGs."""
    s = settings or ReportSettings()
    from .runs import set_device

    device = set_device(s.device)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rep = Report(out)
    meta = meta or {}
    rep.h(1, title)
    rep.p(f"Generated {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} by `analysis/report.py` on "
          f"{platform.machine()} ({platform.python_implementation()} {platform.python_version()}), analyses on "
          f"{device}. "
          f"{len(runs)} runs." + (f" {meta['command']}" if meta.get("command") else ""))
    if meta.get("notes"):
        rep.bullets(meta["notes"])
    rep.p("Conventions. Losses are shown in bits per byte (byte corpora), bits per character, or perplexity "
          "(word corpora) where named `bpb`/`bpc`/`ppl`; figures plot bits (or nats per word). *Attention length* A: "
          "every scored token sees exactly A previous tokens. Runs trained with memory are evaluated with memory A "
          "and the same-length mask (every query attends to the A previous positions in every layer; deeper layers "
          "carry older information through the memory, which is what recurrence is); runs trained without memory "
          "with a sliding window of A tokens (the vanilla Transformer's evaluation). *init* is the loss at the "
          "training attention length (M with memory; L - 1 without, the most context any training token had), *best* "
          "the lowest over the evaluated lengths. "
          "Each analysis scores the same tokens of the validation split for every run. Differences below "
          f"{TOL} are reported as no difference.")

    by_corpus: dict[str, list[Run]] = {}
    for r in runs:
        by_corpus.setdefault(r.corpus_key, []).append(r)
    lm_groups = [g for g in by_corpus.values() if g[0].corpus_name != "recall"]
    recall_groups = [g for g in by_corpus.values() if g[0].corpus_name == "recall"]

    section = 0
    for group in lm_groups:
        unit = group[0].unit
        fig = figure_name(unit)
        sub = out if len(lm_groups) == 1 else out / group[0].corpus_name
        sub.mkdir(parents=True, exist_ok=True)
        corpus_tag = "" if len(lm_groups) == 1 else f" ({group[0].corpus_name})"
        log(f"analysis: {len(group)} runs on {group[0].corpus_name}")
        ctx = effective_context.analyze(group, sub / "effective_context", s.context, log=log)
        ext = extrapolation.analyze(group, sub / "extrapolation", s.extrapolation, log=log)
        att = attention_span.analyze(group, sub / "attention", s.attention, log=log)

        section += 1
        rep.h(2, f"{section}. Ablation table{corpus_tag}")
        cs = sorted(ctx.loss_by_context["c"].unique())
        rep.p(f"Settings: {_settings_line(group)}. Shaped like Transformer-XL Table 6 (WikiText-103): rows are "
              f"encoding x recurrence x training loss. `val_{fig}`: the training run's own validation figure "
              f"(results.json, evaluated as trained). `init_{fig}`: at the training attention length "
              f"`train_attn_len`; `best_{fig}`: the lowest over the evaluated attention lengths A = "
              f"{', '.join(map(str, cs))}, at `best_attn_len`; `eval_mode`: memory (memory A, same-length mask) "
              f"or window (sliding window of A tokens, for runs trained without memory). "
              f"`recl_r*`: relative effective context length (section {section + 1}).")
        t6 = ablation_table(group, ctx.loss_by_context, ctx.recl, unit)
        rep.table(f"table_ablation{'_' + group[0].corpus_name if corpus_tag else ''}", t6,
                  f"ablation: {fig} by scheme, recurrence and loss", {c: 4 for c in t6.columns})
        rep.bullets(ablation_findings(t6, unit))

        section += 1
        rep.h(2, f"{section}. Relative effective context length (RECL){corpus_tag}")
        grid = ctx.grid
        rep.p(f"RECL (Transformer-XL appendix C) of this group of {len(group)} models, from per-token losses at "
              f"context lengths c = {grid[0]}..{grid[-1]} (step delta = {grid[1] - grid[0]}), "
              f"{s.context.n_rows} x {s.context.n_score} scored tokens of the {s.context.split} split: runs with memory "
              f"use memory c with the same-length mask, runs without memory a sliding window of c tokens. RECL = the "
              f"first c where extending the context by delta gains less than 1% relative to the group's best "
              f"(hard tokens: the top r fraction). Per-token losses: `effective_context/context_losses/*.npz`. "
              f"For scale, the paper's values on WikiText-103 (Table 8, group 2; r = 0.1/0.5/1.0): Transformer-XL "
              f"700/600/500, with Shaw's encoding 400/400/300, without recurrence 300/300/300, vanilla Transformer "
              f"128/128/128.")
        recl_t = recl_table(ctx.recl)
        rep.table(f"table_recl{'_' + group[0].corpus_name if corpus_tag else ''}", recl_t,
                  "RECL in tokens for r = 0.1, 0.5, 1.0 ('>c': above the grid; '(limit)': the scheme cannot "
                  "serve the next context length)")
        rep.bullets(recl_findings(ctx.recl))
        rep.figure("loss_by_context", ctx.figures["loss_by_context"],
                   f"mean loss ({fig}) when every scored token sees exactly c previous tokens")
        if ctx.recall is not None:
            rep.figure("recall_accuracy_lm", ctx.figures["recall_accuracy"], "accuracy by distance")

        section += 1
        rep.h(2, f"{section}. Extrapolation{corpus_tag}")
        e = s.extrapolation
        rep.p(f"Window axis: evaluation segment length L' = {', '.join(str(f) + 'L' for f in e.segment_factors)} without "
              f"memory, and attention length M' = {', '.join(str(f) + 'M' for f in e.memory_factors)} with memory and "
              f"the same-length mask (M = L for runs trained without memory). Horizon axis: every run as trained over "
              f"streams of {e.horizon_factor} x the training episode length T, never reset; loss by stream offset, and "
              f"`horizon_past_delta`: past T, the loss minus that of the same tokens evaluated with resets every T "
              f"as in training (so the text's own difficulty cancels). "
              f"Full table (tidy, one row per run, axis and length, with the reason where not applicable): "
              f"`extrapolation/extrapolation.csv`.")
        summ = ext.summary.copy()
        cols = [c for c in ["scheme", "recurrence", "mem_len", "loss", "segment_at_1x", "segment_longest",
                            "segment_at_longest", "segment_na_from", "memory_at_1x", "memory_longest",
                            "memory_at_longest", "horizon_T", "horizon_inside", "horizon_past",
                            "horizon_past_delta", "run"] if c in summ]
        summ = summ[cols]
        for c in ("segment_longest", "segment_na_from", "memory_longest", "horizon_T"):
            if c in summ:
                summ[c] = summ[c].astype("Int64")
        rep.table(f"table_extrapolation{'_' + group[0].corpus_name if corpus_tag else ''}", summ,
                  f"extrapolation summary ({fig}): at the training length (1x), at the longest applicable length, "
                  f"first length not applicable, and the horizon inside vs past the training episodes",
                  {c: 4 for c in summ.columns})
        rep.bullets(extrapolation_findings(ext.summary, ext.table, unit))
        na = ext.table[ext.table["status"] == extrapolation.NA_STATUS][["scheme", "recurrence", "mem_len", "loss", "axis", "length",
                                                      "reason", "run"]]
        if len(na):
            rep.table(f"table_not_applicable{'_' + group[0].corpus_name if corpus_tag else ''}", na.reset_index(drop=True),
                      "evaluations a scheme cannot serve, with its reason")
        rep.figure("extrapolation_segment", ext.figures["segment"],
                   f"window axis, segment length L' without memory ({fig}; gaps = not applicable, see the table)")
        rep.figure("extrapolation_memory", ext.figures["memory"], f"window axis, attention length M' with memory ({fig})")
        rep.figure("extrapolation_horizon", ext.figures["horizon"], f"horizon axis, loss by stream offset ({fig})")

        section += 1
        rep.h(2, f"{section}. Attention spans{corpus_tag}")
        rep.p(f"Attention probabilities of {s.attention.n_segments} segments x {s.attention.n_rows} streams after the "
              f"memory is full, as trained; mass by distance d = i - j averaged over queries (memory keys included). "
              f"`memory_share`: mass on memory keys; `beyond_L_share`: mass at d >= L. Per head and per distance: "
              f"`attention/attention_heads.csv`, `attention/attention_mass.csv`.")
        rep.table(f"table_attention{'_' + group[0].corpus_name if corpus_tag else ''}", att.summary,
                  "attention span per run (mean over layers and heads)",
                  {"mean_distance": 2, "max_head_distance": 2, "memory_share": 4, "beyond_L_share": 4})
        rep.bullets(attention_findings(att.summary))
        for loss, path in att.figures.items():
            rep.figure(f"attention_{loss}", path, f"attention mass by layer/head and distance ({loss} loss runs)")

    if speed and lm_groups + recall_groups:
        group = (lm_groups or recall_groups)[0]
        xl = [r for r in group if r.scheme == "xl"] or group
        model = xl[0].model()
        section += 1
        rep.h(2, f"{section}. Evaluation speed")
        log("analysis: evaluation speed")
        df, figs = eval_speed.analyze(model, s.speed_attn_lens, out / "eval_speed", xl[0].segment_len, s.speed_batch,
                                      s.speed_min_seconds, log=log)
        rep.p(f"Model of {xl[0].label}; {s.speed_batch} parallel streams, segment L = {xl[0].segment_len} for memory reuse, "
              f"{int(df['threads'].iloc[0])} CPU thread(s). Memory reuse: memory M' = A with the same-length mask; "
              f"sliding window: a fresh forward pass over the A previous tokens for every predicted token. Both give "
              f"every token exactly A tokens of context.")
        t = df[["attn_len", "method", "tokens_per_s", "ms_per_token", "speedup"]]
        rep.table("table_eval_speed", t, "evaluation tokens/s and the speed-up of memory reuse",
                  {"tokens_per_s": 1, "ms_per_token": 4, "speedup": 1})
        rep.bullets(speed_findings(df))
        rep.figure("eval_speed", figs["eval_speed"], "evaluation speed, memory reuse vs sliding window")

    for group in recall_groups:
        section += 1
        rep.h(2, f"{section}. Recall probe")
        log(f"analysis: recall, {len(group)} runs")
        sub = out / "recall"
        sub.mkdir(parents=True, exist_ok=True)
        acc = pd.concat([effective_context.recall_accuracy(r, s.split, s.recall_rows, s.recall_tokens) for r in group],
                        ignore_index=True)
        acc.to_csv(sub / "recall_accuracy.csv", index=False)
        from . import plots

        path = plots.recall_accuracy(acc, sub / "recall_accuracy.png")
        rep.p(f"Settings: {_settings_line(group)}. A value is planted and must be answered D tokens later; "
              f"accuracy of the answers by distance (bins of {effective_context.DISTANCE_BIN}), evaluated as trained "
              f"over {s.recall_rows} streams x {s.recall_tokens} tokens. Per bin: `recall/recall_accuracy.csv`.")
        t = recall_table(acc)
        rep.table("table_recall", t, "answer accuracy within one segment (D < L) and beyond it (D >= L)",
                  {"acc_within_L": 4, "acc_beyond_L": 4, "chance": 4})
        rep.bullets(recall_findings(t))
        rep.figure("recall_accuracy", path, "recall accuracy by distance (dotted: segment length; dashed: chance)")

    rep.h(2, "Files")
    rep.p("Every table above is the CSV named in its caption (full precision). Figures are the PNGs shown. "
          "Runs: " + ", ".join(f"`{r.path}`" for r in runs) + ".")
    return rep.write()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="run directories or folders of runs (Hydra multirun, ablation runs/)")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--title", default="posenc-lab ablation report")
    p.add_argument("--experiment", help="take the analysis settings (grids, rows) from this ablation preset's "
                                        "ablate.analysis block, e.g. quick or ablation (default: built-in defaults)")
    p.add_argument("--wandb", metavar="PROJECT", help="also log the report's tables and figures to this wandb project "
                                                      "(analysis/wandb_upload.py; WANDB_MODE=offline works)")
    p.add_argument("--no-speed", action="store_true", help="skip the evaluation-speed timing")
    add_threads_argument(p)
    a = p.parse_args(argv)
    apply_threads(a.threads)
    try:
        settings = None
        if a.experiment:
            from omegaconf import OmegaConf

            from .ablate import compose

            cfg = compose("ablate", [f"experiment={a.experiment}"])
            settings = ReportSettings.from_dict(OmegaConf.to_container(cfg.ablate.analysis, resolve=True))
        runs = find_runs(a.runs)
        command = " ".join(["python -m analysis.report", *map(str, a.runs), "--out", str(a.out)]
                           + (["--experiment", a.experiment] if a.experiment else []))
        path = build_report(runs, a.out, settings, title=a.title, speed=not a.no_speed,
                            meta={"command": f"Command: `{command}`."})
    except (RunError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    if a.wandb:
        log_to_wandb(path.parent, a.wandb, a.runs)
    return 0


def log_to_wandb(report_dir: Path, project: str, runs: Sequence[Path] = (), group: str | None = None) -> str:
    """Log a report (tables, figures, the folder as an artifact) to wandb: analysis.wandb_upload."""
    from .wandb_upload import upload

    return upload(report_dir, runs, project=project, group=group)

if __name__ == "__main__":
    sys.exit(main())
