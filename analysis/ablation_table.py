"""The ablation table (Transformer-XL Table 6) and the paper's findings, each with its interval.

One row per cell (runs equal but for the seed): the loss at the training attention length
("init") and the best over the evaluated attention lengths, mean and spread over the seeds, from
the per-token losses that ``effective_context`` dumps (every run scored on the same tokens).

Every difference is a paired block bootstrap (``analysis.stats``): the per-token losses are summed
over blocks of consecutive tokens, the blocks (and each cell's seeds) resampled; the finding is
"reproduced", "contradicted" or "inconclusive" from where the interval lies, no threshold.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from .effective_context import Dumps, recl_text, run_mode, train_attention_length
from .runs import Run, figure_name, metric_of
from .sections import Section, Table
from .stats import CONTRADICTED, INCONCLUSIVE, REPRODUCED, Bootstrap, Interval, block_sums, combine, sign_text, verdict


@cache
def paper() -> dict:
    """The paper's claims and figures (conf/paper.yaml): which scheme each claim is about."""
    from posenc_lab import config_dir

    return yaml.safe_load((Path(config_dir()) / "paper.yaml").read_text())


def absolute_schemes() -> tuple[str, ...]:
    from posenc_lab.positional import schemes_of_kind

    return schemes_of_kind("absolute")


@dataclass(eq=False)
class Cell:
    """The runs of one cell and their block sums: sums [n_seeds, n_c, n_blocks] nats."""

    name: str
    runs: list[Run]
    sums: np.ndarray

    @property
    def first(self) -> Run:
        return self.runs[0]


@dataclass
class CellLosses:
    cells: dict[str, Cell]
    counts: np.ndarray  # [n_blocks] counted tokens per block (the same for every run)
    contexts: list[int]
    boot: Bootstrap

    def at(self, cell: Cell, c: int) -> np.ndarray:
        """[n_seeds, n_blocks] block sums of ``cell`` at context length ``c``."""
        return cell.sums[:, self.contexts.index(c)]

    def mean(self, cell: Cell, c: int) -> np.ndarray:
        """[n_seeds] mean loss (nats) of each seed's run at c."""
        return self.at(cell, c).sum(-1) / self.counts.sum()


def cell_losses(runs: list[Run], dumps: Dumps, block: int, n_boot: int, level: float, seed: int = 0) -> CellLosses:
    """Block sums of every run's per-token losses, grouped by cell; one Bootstrap for all of them."""
    from .runs import cells

    sums, counts = {}, None
    for run in runs:
        s, counts = block_sums(dumps.tokens[run.name], dumps.mask, block)
        sums[run.name] = s
    keep = counts > 0  # blocks without a counted token (recall: no answer in it) carry nothing
    out = {
        name: Cell(name, group, np.stack([sums[r.name][:, keep] for r in group])) for name, group in cells(runs).items()
    }
    return CellLosses(out, counts[keep], dumps.contexts, Bootstrap(int(keep.sum()), n_boot, level, seed))


def _who(cell: Cell) -> str:
    r = cell.first
    return f"{r.scheme} (memory {'on' if r.recurrence else 'off'}, {r.loss} loss)"


def _spread(values: np.ndarray) -> float:
    return float(np.std(values, ddof=1)) if len(values) > 1 else float("nan")


def ablation_table(cl: CellLosses, unit: str, recl: pd.DataFrame | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per cell: mean and seed spread; one row per run). init: at the training attention
    length (M with memory, L - 1 without); best: the lowest seed-mean loss over the evaluated A."""
    _, scale = metric_of(unit)
    fig = figure_name(unit)
    rows, per_run = [], []
    for cell in cl.cells.values():
        r = cell.first
        A = train_attention_length(r)
        init = cl.mean(cell, A) * scale if A in cl.contexts else np.full(len(cell.runs), np.nan)
        by_c = {c: float(cl.mean(cell, c).mean()) for c in cl.contexts}
        finite = {c: v for c, v in by_c.items() if np.isfinite(v)}
        best_c = min(finite, key=finite.get) if finite else None
        val = np.array([float(((x.results or {}).get("val") or {}).get("loss", np.nan)) for x in cell.runs]) * scale
        row = {
            "scheme": r.scheme,
            "recurrence": "on" if r.recurrence else "off",
            "loss": r.loss,
            "mem_len": r.mem_len,
            "segment_len": r.segment_len,
            "seeds": len(cell.runs),
            f"val_{fig}": float(np.mean(val)),
            "eval_mode": run_mode(r, "auto"),
            "train_attn_len": A,
            f"init_{fig}": float(np.mean(init)),
            f"init_{fig}_sd": _spread(init),
            f"best_{fig}": finite[best_c] * scale if best_c else np.nan,
            "best_attn_len": best_c,
        }
        if recl is not None:
            for rv in sorted(set(recl["r"])):
                hit = recl[(recl["cell"] == cell.name) & (recl["r"] == rv)]
                row[f"recl_r{rv:g}"] = recl_cell(hit)
        row["cell"] = cell.name
        rows.append(row)
        for x, v in zip(cell.runs, init):
            per_run.append(
                {
                    "cell": cell.name,
                    "seed": x.seed,
                    f"val_{fig}": float(((x.results or {}).get("val") or {}).get("loss", np.nan)) * scale,
                    f"init_{fig}": float(v),
                    "run": x.name,
                }
            )
    rows = _not_trained(rows)
    df = pd.DataFrame(rows)
    for c in ("mem_len", "segment_len", "seeds", "train_attn_len", "best_attn_len"):
        df[c] = df[c].astype("Int64")
    return df, pd.DataFrame(per_run)


def _not_trained(rows: list[dict]) -> list[dict]:
    """Table 6's shape: a scheme trained with memory but not without it (``ablate.no_memory_schemes``)
    gets a "not trained" row without memory, so the gap is visible, not silent."""
    out = []
    have = {(r["scheme"], r["recurrence"], r["loss"]) for r in rows}
    for r in rows:
        out.append(r)
        if r["recurrence"] == "on" and r["loss"] == "full" and (r["scheme"], "off", "full") not in have:
            out.append(
                {
                    "scheme": r["scheme"],
                    "recurrence": "off",
                    "loss": "full",
                    "mem_len": 0,
                    "segment_len": r["segment_len"],
                    "seeds": 0,
                    "eval_mode": "not trained",
                    "cell": f"{r['scheme']}, mem 0, full loss",
                }
            )
    return out


def recl_cell(hit: pd.DataFrame) -> str:
    """'96 [64, 128]': the (guarded) RECL and its bootstrap interval; '>c' above the grid."""
    if hit.empty:
        return "n/a"
    h = hit.iloc[0]
    text = recl_text(h["recl"], bool(h["censored"]), bool(h.get("limited", False)))
    if text != "n/a" and np.isfinite(h.get("recl_lo", np.nan)):
        text += f" [{int(h['recl_lo'])}, {int(h['recl_hi'])}]"
    return text


# ---- the findings ---------------------------------------------------------------------------------


@dataclass
class Contrast:
    """a - b in the corpus metric, with its interval and (for a paper finding) its verdict."""

    iv: Interval
    what: str


def _diff(cl: CellLosses, a: Cell, ca: int, b: Cell, cb: int, scale: float) -> Interval:
    same = a is b
    return cl.boot.diff(cl.at(a, ca), cl.at(b, cb), cl.counts, same_runs=same).scaled(scale)


def _find(cl: CellLosses, scheme: str, memory: bool, loss: str = "full") -> Cell | None:
    for c in cl.cells.values():
        r = c.first
        if r.scheme == scheme and r.recurrence == memory and r.loss == loss:
            return c
    return None


def _init(cell: Cell) -> int:
    return train_attention_length(cell.first)


def findings(cl: CellLosses, unit: str, smoke: bool = False) -> list[str]:
    """The paper's findings and the differences the table shows, each with its interval."""
    _, scale = metric_of(unit)
    fig = figure_name(unit)
    level = f"{cl.boot.level:.0%}"
    lines = []

    def judged(v: str) -> str:
        return "not judged (smoke run)" if smoke else v

    ok = [c for c in cl.cells.values() if _init(c) in cl.contexts and np.isfinite(cl.mean(c, _init(c))).all()]
    if not ok:
        return ["No cell could be evaluated at its training attention length."]

    def iv_text(iv: Interval) -> str:
        return iv.text(3)

    xl, shaw = paper()["proposed"], paper()["prior_relative"]
    absolute = absolute_schemes()
    xl_on = _find(cl, xl, True)
    # 1. XL with recurrence is best: xl (memory, full loss) against every other cell, at init.
    if xl_on is not None and xl_on in ok:
        others = [c for c in ok if c is not xl_on and not (c.first.scheme == xl and c.first.recurrence)]
        parts, verdicts = [], []
        for c in others:
            iv = _diff(cl, c, _init(c), xl_on, _init(xl_on), scale)
            verdicts.append(verdict(iv, ">0"))
            parts.append(f"{_who(c)} {iv_text(iv)}")
        if others:
            lines.append(
                f'Paper: "XL encoding with recurrence is best": **{judged(combine(verdicts))}** '
                f"(each other cell minus xl with memory, {fig} at the training attention length, "
                f"{level} interval: " + "; ".join(parts) + ")."
            )
    # 2. The ordering xl < shaw < absolute, all with memory.
    shaw_on = _find(cl, shaw, True)
    if xl_on in ok and shaw_on in ok:
        iv = _diff(cl, xl_on, _init(xl_on), shaw_on, _init(shaw_on), scale)
        lines.append(
            f'Paper: "XL beats Shaw\'s encoding" (with memory): **{judged(verdict(iv, "<0"))}** '
            f"(xl minus shaw {iv_text(iv)} {fig})."
        )
    abs_on = [c for c in (_find(cl, s, True) for s in absolute) if c in ok]
    if shaw_on in ok and abs_on:
        parts, verdicts = [], []
        for c in abs_on:
            iv = _diff(cl, shaw_on, _init(shaw_on), c, _init(c), scale)
            verdicts.append(verdict(iv, "<0"))
            parts.append(f"minus {c.first.scheme} {iv_text(iv)}")
        lines.append(
            f'Paper: "Shaw\'s encoding beats the absolute encodings" (with memory): '
            f"**{judged(combine(verdicts))}** (shaw " + "; ".join(parts) + f" {fig})."
        )
    # 3. Memory on vs off (full loss) per scheme; the paper's claim is about xl.
    parts = []
    for scheme in dict.fromkeys(c.first.scheme for c in ok):
        on, off = _find(cl, scheme, True), _find(cl, scheme, False)
        if on in ok and off in ok:
            iv = _diff(cl, on, _init(on), off, _init(off), scale)
            parts.append((scheme, iv))
    if parts:
        xl_part = [iv for s, iv in parts if s == xl]
        head = (
            'Paper: "recurrence helps the XL encoding", at equal attention length: '
            f"**{judged(verdict(xl_part[0], '<0'))}**. "
            if xl_part
            else ""
        )
        lines.append(
            head
            + "Memory on minus off (full loss, each at its training attention length): "
            + "; ".join(f"{s} {iv_text(iv)} ({sign_text(iv)})" for s, iv in parts)
            + f" {fig}."
        )
    elif xl_on is not None:
        lines.append("No scheme was trained both with and without memory (full loss): no memory comparison.")
    # 4. Absolute encodings need the half loss (with memory).
    half = []
    for c in ok:
        if c.first.loss == "half" and c.first.recurrence:
            full = _find(cl, c.first.scheme, True)
            if full in ok:
                half.append((c.first.scheme, _diff(cl, c, _init(c), full, _init(full), scale)))
    if half:
        abs_half = [(s, iv) for s, iv in half if s in absolute]
        txt = "; ".join(f"{s} {iv_text(iv)} ({sign_text(iv)})" for s, iv in half)
        if abs_half:
            v = combine([verdict(iv, "<0") for _, iv in abs_half])
            lines.append(
                f'Paper: "absolute encodings need the half loss": **{judged(v)}** (half minus full loss at '
                f"the training attention length, with memory: {txt} {fig})."
            )
        else:
            lines.append(f"Half minus full loss at the training attention length, with memory: {txt} {fig}.")
    # 5. A longer evaluation attention helps only XL: the longest evaluated A minus init, same runs.
    longest = max(cl.contexts)
    gains = []
    for c in ok:
        served = np.isfinite(cl.mean(c, longest)).all()
        if c.first.recurrence and c.first.loss == "full" and longest > _init(c) and served:
            gains.append((c, _diff(cl, c, longest, c, _init(c), scale)))
    if gains:
        xl_gain = [iv for c, iv in gains if c.first.scheme == xl]
        helped = [c.first.scheme for c, iv in gains if iv.hi < 0 and c.first.scheme != xl]
        if not xl_gain:
            v = INCONCLUSIVE
        elif helped or verdict(xl_gain[0], "<0") == CONTRADICTED:
            v = CONTRADICTED
        else:
            v = REPRODUCED if verdict(xl_gain[0], "<0") == REPRODUCED else INCONCLUSIVE
        lines.append(
            f'Paper: "a longer evaluation attention helps only the XL encoding": **{judged(v)}** '
            f"(loss at attention length {longest} minus at the training length, runs with memory, full loss: "
            + "; ".join(f"{c.first.scheme} {iv_text(iv)} ({sign_text(iv)})" for c, iv in gains)
            + f" {fig}"
            + (f"; also helps {', '.join(helped)}" if helped else "")
            + ")."
        )
    best = min(ok, key=lambda c: float(cl.mean(c, _init(c)).mean()))
    lines.insert(
        0,
        f"Lowest {fig} at the training attention length: {_who(best)}, "
        f"{float(cl.mean(best, _init(best)).mean()) * scale:.3f}.",
    )
    return lines


def section(
    runs: list[Run],
    cl: CellLosses,
    recl: pd.DataFrame | None,
    settings_line: str,
    recl_section: int,
    suffix: str = "",
    smoke: bool = False,
) -> Section:
    unit = runs[0].unit
    fig = figure_name(unit)
    t6, per_run = ablation_table(cl, unit, recl)
    seeds = {c.name: [r.seed for r in c.runs] for c in cl.cells.values()}
    n_seeds = sorted({len(v) for v in seeds.values()})
    several = [f"{name} ({len(v)}: {', '.join(map(str, v))})" for name, v in seeds.items() if len(v) > 1]
    text = (
        f"Settings: {settings_line}. Shaped like Transformer-XL Table 6 (WikiText-103): one row per cell "
        f"(encoding x recurrence x training loss), the mean over its `seeds` training runs. `val_{fig}`: "
        f"the runs' own validation figure (results.json, evaluated as trained). `init_{fig}`: at the training "
        f"attention length `train_attn_len` (`init_{fig}_sd`: the standard deviation over seeds, n/a for one "
        f"seed); `best_{fig}`: the lowest over the evaluated attention lengths A = "
        f"{', '.join(map(str, cl.contexts))}, at `best_attn_len` (chosen on the same tokens, so slightly "
        f"optimistic); `eval_mode`: memory (memory A, same-length mask) or window (sliding window of A tokens, "
        f"for runs trained without memory). `recl_r*`: RECL and its interval (section {recl_section}). "
        f"Seeds per cell: {'/'.join(map(str, n_seeds))}"
        + (
            f"; several seeds: {'; '.join(several)}"
            if several
            else " (one seed each: the intervals cover the evaluation text, not the training seed)"
        )
        + ". Every run per seed: "
        f"`table_ablation_runs{suffix}.csv`."
    )
    t = Table(
        f"table_ablation{suffix}", t6, f"ablation: {fig} by scheme, recurrence and loss", {c: 4 for c in t6.columns}
    )
    return Section(
        f"Ablation table{' (' + suffix.strip('_') + ')' if suffix else ''}",
        text,
        [t, Table(f"table_ablation_runs{suffix}", per_run, "every run (seed) of the table", show=False)],
        findings=findings(cl, unit, smoke),
    )
