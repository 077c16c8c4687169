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
from . import Section, Table


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


def section(df: pd.DataFrame, fig: str, unit_name: str, settings_line: str, trained_tokens: str, suffix: str = ""):
    text = (
        f"Settings: {settings_line}. One row per cell (runs equal but for their seed), the mean over its `seeds`. "
        f"`test_{fig}`: the runs evaluated as trained on {trained_tokens} of the test split, with its interval "
        f"(seeds and documents, `stats.mean_interval`). `vs_lowest`: the difference to the cell with the lowest "
        f"mean, with its interval ({unit_name}): a cell whose interval holds 0 is not distinguishable from it (a "
        f"ranking with intervals; picking the lowest by its mean makes this slightly optimistic). `init_{fig}`: "
        f"every scored token seeing exactly `train_A` previous tokens (memory A with the same-length mask, or a "
        f"window of A without memory); `best_{fig}`: the lowest over the evaluated attention lengths, at `best_A` "
        f"(chosen on the same tokens: optimistic). `recl_r0.1`: RECL with its interval (RECL section). "
        f"Descriptive: no statement here is a verdict."
    )
    t = Table(f"table_ablation{suffix}", df, f"ablation: {fig} by cell", {c: 4 for c in df.columns})
    return Section(f"Ablation table{' (' + suffix.strip('_') + ')' if suffix else ''}", text, [t])
