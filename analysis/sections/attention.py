"""The attention-span section (descriptive): where each run looks, by layer, head and distance."""

from __future__ import annotations

from ..attention_span import AttentionResult, AttentionSettings, analyze
from .base import Figure, Part, Section, Table, register


@register
class Attention(Section):
    name = "attention"
    title = "Attention spans"
    Settings = AttentionSettings

    def measure(self, ctx) -> AttentionResult:
        few = [r for runs in ctx.group.few_cells.values() for r in runs]  # descriptive: fewer seeds
        return analyze(few, ctx.out / "attention", ctx.settings, ctx.shared.split, log=ctx.log)

    def render(self, ctx, res: AttentionResult) -> Part:
        s = ctx.settings
        text = (
            f"Attention probabilities of {s.n_segments} segments x {s.n_rows} streams of the test split after the "
            f"memory is full, as trained; mass by distance d = i - j averaged over queries (memory keys included). "
            f"`memory_share`: mass on memory keys; `first_key_share`: mass on the oldest key a query sees (the "
            f"memory's first slot, or the segment's first token), where attention without a sink piles what it cannot "
            f"place (StreamingLLM's sink); `sink_share`: mass a trained sink takes (`+sink` cells; 0 elsewhere); "
            f"`beyond_L_share`: mass at d >= L. One run per row (no interval: "
            f"a description of trained weights, not a comparison). Per head and distance: "
            f"`attention/attention_heads.csv`, `attention/attention_mass.csv`."
        )
        t = Table(
            "table_attention",
            res.summary,
            "attention span per run (mean over layers and heads)",
            {
                "mean_distance": 2,
                "max_head_distance": 2,
                "memory_share": 4,
                "first_key_share": 4,
                "sink_share": 4,
                "beyond_L_share": 4,
            },
        )
        figs = [
            Figure(path, f"attention mass by layer/head and distance ({loss} loss runs)")
            for loss, path in res.figures.items()
        ]
        return Part(text, [t], figs)
