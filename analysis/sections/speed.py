"""The evaluation-speed section: memory reuse against a recomputed sliding window (Transformer-XL Table 9)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import Figure, Section, Table


def section(
    df: pd.DataFrame, figures: dict[str, Path], label: str, segment_len: int, batch: int, paper_speed: str = ""
) -> Section:
    text = (
        f"Model of {label}; {batch} parallel streams, segment L = {segment_len} for memory reuse, "
        f"{int(df['threads'].iloc[0])} CPU thread(s). Memory reuse: memory M' = A with the same-length mask; "
        f"sliding window: a fresh forward pass over the A previous tokens for every predicted token. Both give "
        f"every token exactly A tokens of context. Timings on this machine (the preamble names it), median of "
        f"repeated calls; no interval."
    )
    t = Table(
        "table_eval_speed",
        df[["attn_len", "method", "tokens_per_s", "ms_per_token", "speedup"]],
        "evaluation tokens/s and the speed-up of memory reuse",
        {"tokens_per_s": 1, "ms_per_token": 4, "speedup": 1},
    )
    mem = df[df["method"] == "memory"].sort_values("attn_len")
    lines = []
    if len(mem):
        parts = ", ".join(f"{r['speedup']:.0f}x at {int(r['attn_len'])}" for _, r in mem.iterrows())
        ref = f" (paper, GPU: {paper_speed})" if paper_speed else ""
        lines.append(f"Memory reuse against a recomputed sliding window: {parts}{ref}.")
    return Section(
        "Evaluation speed",
        text,
        [t],
        [Figure(figures["eval_speed"], "evaluation speed, memory reuse vs sliding window")],
        lines,
    )
