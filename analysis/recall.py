"""The recall probe: answer accuracy by distance, per run and per cell, from the as-trained dumps.

A value is planted and must be answered D tokens later (``posenc_lab.data.recall``); only answers are
scored. Beyond one segment (D >= L) an answer can come only from the memory.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .dumps import TokenLosses
from .runs import Run

DISTANCE_BIN = 8


def chance(run: Run) -> float:
    """1 / the number of values the probe plants (its vocabulary's ``v*`` symbols)."""
    n_values = sum(1 for s in (run.corpus().itos or []) if s.startswith("v"))
    return 1 / n_values if n_values else float("nan")


def accuracy_by_distance(run: Run, dump: TokenLosses, bin_width: int = DISTANCE_BIN) -> pd.DataFrame:
    """One row per distance bin: accuracy and answers of ``run`` (tidy, with the run's keys)."""
    answered = dump.scored & (dump.distance >= 0)
    df = pd.DataFrame({"distance": dump.distance[answered], "correct": dump.correct[0][answered]})
    df["bin_lo"] = (df["distance"] // bin_width) * bin_width
    out = df.groupby("bin_lo").agg(accuracy=("correct", "mean"), answers=("correct", "size")).reset_index()
    out["distance"] = out["bin_lo"] + (bin_width - 1) / 2
    out["chance"] = chance(run)
    out["segment_len"] = run.segment_len
    for k, v in run.key.items():
        out[k] = v
    out["seed"] = run.seed
    return out


def beyond_segment(run: Run, dump: TokenLosses) -> np.ndarray:
    """[answers] bool: the scored answers at distance >= L (the ones only memory can reach)."""
    answered = dump.scored & (dump.distance >= 0)
    return dump.distance[answered] >= run.segment_len
