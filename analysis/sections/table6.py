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
from ..stats import mean_interval, paired_difference
from .base import Part, Section, Table, register


def rows(
    cells: dict[str, list[Run]],
    trained: dict[str, TokenLosses],
    contexts: dict[str, TokenLosses] | None,
    documents: np.ndarray,
    scale: float,
    fig: str,
    recl_table: pd.DataFrame | None = None,
) -> pd.DataFrame:
    values = {c: stack([trained[r.name] for r in g]) for c, g in cells.items()}
    means = {c: mean_interval(v, documents).scaled(scale) for c, v in values.items()}
    lowest = min(means, key=lambda c: means[c].estimate)
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
            "interval": means[c].text(4, signed=False),
            "vs_lowest": "0 (the lowest)"
            if c == lowest
            else paired_difference(values[c], values[lowest], documents).scaled(scale).text(3),
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
        return rows(g.cells, g.trained, g.at_contexts, documents, g.scale, g.figure, ctx.measured("recl").table)

    def render(self, ctx, df: pd.DataFrame) -> Part:
        g, fig = ctx.group, ctx.group.figure
        n_trained = int(next(iter(g.trained.values())).scored.sum())
        text = (
            f"Settings: {g.settings_line}. One row per cell (runs equal but for their seed), the mean over its "
            f"`seeds`. `test_{fig}`: the runs evaluated as trained on {n_trained:,} tokens of the test split, with "
            "its interval (over seeds and the text's units, families or documents; the text alone for a cell of "
            "one seed; `stats.mean_interval`). `vs_lowest`: the difference to the cell "
            f"with the lowest mean, with its interval ({g.unit_name}): a cell whose interval holds 0 is not "
            f"distinguishable from it (a ranking with intervals; picking the lowest by its mean makes this slightly "
            f"optimistic). `init_{fig}`: every scored token seeing exactly `train_A` previous tokens (memory A with "
            f"the same-length mask, or a window of A without memory); `best_{fig}`: the lowest over the evaluated "
            f"attention lengths, at `best_A` (chosen on the same tokens: optimistic). `recl_r0.1`: RECL with its "
            f"interval (RECL section). Descriptive: no statement here is a verdict."
        )
        return Part(text, [Table("table_ablation", df, f"ablation: {fig} by cell", {c: 4 for c in df.columns})])
