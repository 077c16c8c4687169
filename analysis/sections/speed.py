"""The evaluation-speed section: memory reuse against a recomputed sliding window (Transformer-XL Table 9), timed
on a model of the `proposed` scheme of conf/paper.yaml (else the first run of the report)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..eval_speed import SpeedSettings, analyze
from ..runs import Run
from .base import REPORT, Figure, Part, Section, Table, register


@dataclass
class Timed:
    run: Run
    df: pd.DataFrame
    figures: dict[str, Path]


@register
class Speed(Section):
    name = "speed"
    title = "Evaluation speed"
    scope = REPORT
    Settings = SpeedSettings

    def measure(self, ctx) -> Timed | None:
        groups = ctx.report.corpora or ctx.report.recalls
        if not groups:
            return None
        runs = groups[0].runs
        timed = [r for r in runs if r.scheme == ctx.report.paper.get("proposed")] or runs
        ctx.log("analysis: evaluation speed")
        df, figures = analyze(timed[0].model(), ctx.settings, ctx.out / "eval_speed", timed[0].segment_len, log=ctx.log)
        return Timed(timed[0], df, figures)

    def render(self, ctx, m: Timed | None) -> Part | None:
        if m is None:
            return None
        df, paper_speed = m.df, ctx.report.paper.get("speed", "")
        text = (
            f"Model of {m.run.label}; {ctx.settings.batch} parallel streams, segment L = {m.run.segment_len} for "
            f"memory reuse, {int(df['threads'].iloc[0])} CPU thread(s). Memory reuse: memory M' = A with the "
            f"same-length mask; sliding window: a fresh forward pass over the A previous tokens for every predicted "
            f"token. Both give every token exactly A tokens of context. Timings on this machine (the preamble names "
            f"it), median of repeated calls; no interval."
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
        return Part(
            text, [t], [Figure(m.figures["eval_speed"], "evaluation speed, memory reuse vs sliding window")], lines
        )
