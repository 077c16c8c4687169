"""Table 6 of Transformer-XL, our shape: one row per cell (scheme x memory x training loss), the test loss as
trained with its interval, the difference to the lowest cell (a ranking with intervals), the loss at the
training attention length (init) and the best over the evaluated attention lengths, and RECL. Descriptive:
the verdicts are the only judged statements."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..dumps import TokenLosses, stack
from ..recl import recl_text
from ..runs import Run
from ..stats import Difference, mean_interval, paired_difference
from .base import Part, Section, Table, register

TEXT_ONLY = " (one seed: the text only, no seed variation)"


def shown(d: Difference, digits: int, signed: bool = True) -> str:
    """An interval as a row shows it, labelled where it covers the text alone (a cell of one seed: such an
    interval leaves out the seed-to-seed spread and covers far less than its level of the seed-inclusive truth)."""
    return d.text(digits, signed) + (TEXT_ONLY if np.isfinite(d.estimate) and not d.covers_seeds else "")


def rows(
    cells: dict[str, list[Run]],
    trained: dict[str, TokenLosses],
    contexts: dict[str, TokenLosses] | None,
    documents: np.ndarray,
    scale: float,
    fig: str,
    level: float,
    recl_table: pd.DataFrame | None = None,
) -> pd.DataFrame:
    values = {c: stack([trained[r.name] for r in g]) for c, g in cells.items()}
    means = {c: mean_interval(v, documents, level).scaled(scale) for c, v in values.items()}
    finite = [c for c in means if np.isfinite(means[c].estimate)]  # a NaN mean ranks nowhere, whatever the order
    lowest = min(finite, key=lambda c: means[c].estimate) if finite else None
    out = []
    for c, g in cells.items():
        r = g[0]
        row = {
            "cell": c,
            "scheme": r.scheme,
            "mem_len": r.mem_len,
            "loss": r.loss,
            "seeds": len(g),
            f"test_{fig}": means[c].estimate,
            "interval": shown(means[c], 4, signed=False),
            "vs_lowest": "0 (the lowest)"
            if c == lowest
            else "n/a"
            if lowest is None
            else shown(paired_difference(values[c], values[lowest], documents, level).scaled(scale), 3),
        }
        if contexts is not None:
            d = [contexts[x.name] for x in g]
            by_c = {k: float(np.mean([x.at(k).mean() for x in d])) for k in d[0].contexts}
            served = {k: v for k, v in by_c.items() if np.isfinite(v)}
            A = r.train_attention_length
            row[f"init_{fig}"] = by_c.get(A, np.nan) * scale
            row["train_A"] = A
            best = min(served, key=served.get) if served else None
            row[f"best_{fig}"] = served[best] * scale if best is not None else np.nan
            row["best_A"] = best
        if recl_table is not None:
            hit = recl_table[(recl_table["model"] == c) & (recl_table["r"] == 0.1)]
            if len(hit):
                h = hit.iloc[0]
                row["recl_r0.1"] = recl_text(h["recl"], bool(h["censored"])) + (
                    f" [{recl_text(h['recl_low'], False)}, {recl_text(h['recl_high'], False)}]"
                    if np.isfinite(h["recl_low"])
                    else ""
                )
        out.append(row)
    return pd.DataFrame(out)


@register
class Table6(Section):
    name = "table6"
    title = "Ablation table"

    def measure(self, ctx) -> pd.DataFrame:
        g = ctx.group
        documents = g.evidence["as_trained"].documents
        recl_table = ctx.measured("recl").table
        return rows(g.cells, g.trained, g.at_contexts, documents, g.scale, g.figure, ctx.shared.level, recl_table)

    def render(self, ctx, df: pd.DataFrame) -> Part:
        g, fig = ctx.group, ctx.group.figure
        n_trained = int(next(iter(g.trained.values())).scored.sum())
        text = (
            f"Settings: {g.settings_line}. One row per cell (runs equal but for their seed), the mean over its "
            f"`seeds`. `test_{fig}`: the runs evaluated as trained on {n_trained:,} tokens of the test split, with "
            f"its {ctx.shared.level:.0%} interval (over seeds and the text's units, families or documents; the text "
            "alone for a cell of one seed, labelled so in its row; `stats.mean_interval`). `vs_lowest`: the "
            f"difference to the cell with the lowest mean, with its interval ({g.unit_name}): a cell whose interval "
            "holds 0 is not distinguishable from it (a ranking with intervals; picking the lowest by its mean makes "
            f"this slightly optimistic). `init_{fig}`: every scored token seeing exactly `train_A` previous tokens "
            f"(memory A with the same-length mask, or a window of A without memory); `best_{fig}`: the lowest over "
            "the evaluated attention lengths, at `best_A` (chosen on the same tokens: optimistic). `recl_r0.1`: RECL "
            "with its interval (RECL section). Descriptive: no statement here is a verdict."
        )
        return Part(text, [Table("table_ablation", df, f"ablation: {fig} by cell", {c: 4 for c in df.columns})])
