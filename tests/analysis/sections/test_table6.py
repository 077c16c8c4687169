"""Table 6 (posenc_lab_analysis.sections.table6): the ranking against the lowest cell does not depend on the order
of the cells when a cell's mean is not finite, and an interval that covers the text alone says so in its row."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from posenc_lab_analysis.dumps import TokenLosses
from posenc_lab_analysis.sections.table6 import TEXT_ONLY, rows

UNITS = np.repeat(np.arange(8), 25)


def dump(rng, mean: float) -> TokenLosses:
    n = len(UNITS)
    loss = (mean + rng.normal(0, 0.1, n) if np.isfinite(mean) else np.full(n, np.nan))[None, None]
    return TokenLosses(
        loss, np.zeros_like(loss, bool), UNITS[None], UNITS[None], np.ones((1, n), bool), np.zeros((1, n)), [16], {}
    )


def grid(rng, means: dict[str, list[float]]):
    cells, trained = {}, {}
    for cell, seeds in means.items():
        runs = [SimpleNamespace(name=f"{cell}_{i}", scheme=cell, mem_len=16, loss="full") for i in range(len(seeds))]
        cells[cell] = runs
        trained |= {r.name: dump(rng, m) for r, m in zip(runs, seeds)}
    return cells, trained


def table(means: dict[str, list[float]]):
    cells, trained = grid(np.random.default_rng(0), means)
    return rows(cells, trained, None, UNITS, 1.0, "nats", 0.9).set_index("cell")


def test_the_lowest_cell_is_the_lowest_finite_mean_in_any_order():
    means = {"nan": [np.nan, np.nan], "high": [2.0, 2.01], "low": [1.0, 1.02]}
    for order in (["nan", "high", "low"], ["low", "nan", "high"], ["high", "low", "nan"]):
        t = table({c: means[c] for c in order})
        assert t.loc["low", "vs_lowest"] == "0 (the lowest)", order
        assert 0.9 < float(t.loc["high", "vs_lowest"].split()[0]) < 1.1, order
        assert t.loc["nan", "vs_lowest"] == "n/a", order


def test_an_interval_of_one_seed_says_in_its_row_that_it_covers_the_text_only():
    t = table({"one": [1.0], "two": [1.5, 1.52]})
    assert t.loc["one", "interval"].endswith(TEXT_ONLY) and not t.loc["two", "interval"].endswith(TEXT_ONLY)
    assert t.loc["two", "vs_lowest"].endswith(TEXT_ONLY)  # against a one-seed cell: the text alone
    assert "seed" in TEXT_ONLY and "text only" in TEXT_ONLY
