"""How often training scores each relative distance: STRING's diagnosis (An et al., ICLR 2025), that the
frequency of relative positions in training is skewed to the left, so the largest distances a model may attend over
are the least trained.

For a run's segment L, memory M, episode T (streams reset every T tokens; None: never) and its same-length window:
segment t of an episode (t = 0, 1, ...) has M_t = min(M, t L) memory keys (a static memory fills from the episode's
start), and its query i (0..L-1) sees the keys j = -M_t..i, within the window where there is one. ``counts[d]`` is
the number of (query, key) pairs at distance d = i - j over one episode (over one segment with a full memory where
the stream never resets), d = 0..M + L - 1; every training step scores these pairs once a stream. Without memory
d < L, and count(d) = L - d: the left skew in its plainest form.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def distance_counts(segment_len: int, mem_len: int, episode_len: int | None, window: int | None = None) -> np.ndarray:
    """[M + L] int: the (query, key) pairs at each distance over one episode (module docstring); ``window``: the
    keys a query sees with the same-length mask (None: all)."""
    L, M = segment_len, mem_len
    segments = max(1, episode_len // L) if episode_len else 1
    counts = np.zeros(M + L, dtype=np.int64)
    for t in range(segments):
        memory = M if not episode_len else min(M, t * L)
        for i in range(L):
            reach = i + memory  # the farthest key query i sees
            if window is not None:
                reach = min(reach, window - 1)
            counts[: reach + 1] += 1
    return counts


def frequency_table(settings: dict[str, tuple[int, int, int | None, int | None]]) -> pd.DataFrame:
    """One row per cell and distance: ``settings`` cell -> (L, M, T, window) -> columns cell, distance, pairs,
    share (of the cell's pairs), relative (to distance 0)."""
    rows = []
    for cell, (L, M, T, window) in settings.items():
        counts = distance_counts(L, M, T, window)
        total = counts.sum()
        rows += [
            {"cell": cell, "distance": d, "pairs": int(n), "share": n / total, "relative": n / counts[0]}
            for d, n in enumerate(counts)
        ]
    return pd.DataFrame(rows)


def summary(freq: pd.DataFrame, segment_len: dict[str, int]) -> pd.DataFrame:
    """Per cell: the share of training pairs at distance >= L (past one segment), and the frequency of the largest
    distance relative to distance 0."""
    out = []
    for cell, part in freq.groupby("cell", sort=False):
        L = segment_len[cell]
        out.append(
            {
                "cell": cell,
                "largest_distance": int(part["distance"].max()),
                "share_at_or_past_L": float(part.loc[part["distance"] >= L, "share"].sum()),
                "largest_vs_0": float(part["relative"].iloc[-1]),
            }
        )
    return pd.DataFrame(out)
