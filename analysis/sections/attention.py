"""The attention-span section (descriptive): where each run looks, by layer, head and distance."""

from __future__ import annotations

from ..attention_span import AttentionResult, AttentionSettings
from . import Figure, Section, Table


def section(res: AttentionResult, s: AttentionSettings, suffix: str = "") -> Section:
    text = (
        f"Attention probabilities of {s.n_segments} segments x {s.n_rows} streams of the test split after the "
        f"memory is full, as trained; mass by distance d = i - j averaged over queries (memory keys included). "
        f"`memory_share`: mass on memory keys; `beyond_L_share`: mass at d >= L. One run per row (no interval: "
        f"a description of trained weights, not a comparison). Per head and distance: "
        f"`attention/attention_heads.csv`, `attention/attention_mass.csv`."
    )
    t = Table(
        f"table_attention{suffix}",
        res.summary,
        "attention span per run (mean over layers and heads)",
        {"mean_distance": 2, "max_head_distance": 2, "memory_share": 4, "beyond_L_share": 4},
    )
    figs = [
        Figure(path, f"attention mass by layer/head and distance ({loss} loss runs)")
        for loss, path in res.figures.items()
    ]
    return Section(f"Attention spans{' (' + suffix.strip('_') + ')' if suffix else ''}", text, [t], figs)
