"""The perturbed-context statistics and the long-range tokens, on numbers and texts whose answer is known by
construction."""

from __future__ import annotations

import numpy as np
import pytest

from posenc_lab_analysis.perturbation import PerturbationSettings, long_range, partners, use_table
from posenc_lab_analysis.runs import RunError


def test_long_range_tokens_are_those_a_planted_text_repeats_from_far_only():
    # one document of random symbols; a 9-gram a planted at 10..18 and again at 210..218 (distance 200), another, b,
    # at 300..308, 340..348 (40 after the first: within span = 64) and 500..508 (160 and 200 after the others: far
    # only)
    rng = np.random.default_rng(0)
    data = rng.integers(10, 250, 1200)
    a, b = rng.integers(0, 10, 9), rng.integers(0, 10, 9)  # symbols the background never uses
    data[10:19] = data[210:219] = a
    data[300:309] = data[340:349] = data[500:509] = b
    documents = np.zeros(len(data), dtype=np.int64)
    targets = np.arange(100, 1200)
    found = long_range(data, documents, targets, span=64, n=8)
    assert set(targets[found]) == {218, 508}  # the far repeats' last symbol; 348 has its copy 40 back
    # the same text cut into two documents at 100: the first copy of a lies in another document, so 218 is not one
    documents[100:] = 1
    assert set(targets[long_range(data, documents, targets, span=64, n=8)]) == {508}
    # 4 span is the far end: with span 40, 218's copy (200 back) is past 160 and 508's (160 back from 348) is not
    documents[:] = 0
    assert set(targets[long_range(data, documents, targets, span=40, n=8)]) == {508}


def test_use_and_the_context_used_from_synthetic_use_values():
    # three seeds, 40 units of 10 tokens: use(d) = 0.5 up to d = 8, 0.05 at 16, exactly 0 from 32 on, with noise
    rng = np.random.default_rng(1)
    distances = [0, 8, 16, 32, 64]
    units = np.repeat(np.arange(40), 10)
    signal = np.array([0.5, 0.5, 0.05, 0.0, 0.0])
    x = signal[None, :, None] + rng.normal(0, 0.05, (3, 5, 400)) * (signal > 0)[None, :, None]
    curves, used = use_table({"a": x}, distances, units, 0.95, {"a": [0, 1, 2]}, n_boot=50)
    assert list(curves["d"]) == distances
    np.testing.assert_allclose(curves["use"], x.mean((0, 2)))
    np.testing.assert_allclose(curves["use_seed2"], x[2].mean(1))
    assert (curves.loc[curves["d"] >= 32, "use"] == 0).all()
    assert used.loc[0, "context_used"] == 16 and used.loc[0, "context_used_per_seed"] == "16, 16, 16"
    assert used.loc[0, "used_low"] == used.loc[0, "used_high"] == 16  # a clear signal: every replicate finds 16
    # at 16 a use too small for 400 tokens to show: the context used drops to 8, and its interval holds 8
    faint = x.copy()
    faint[:, 2] = 0.002 + rng.normal(0, 0.05, (3, 400))
    _, used = use_table({"a": faint}, distances, units, 0.95, {"a": [0, 1, 2]}, n_boot=50)
    assert used.loc[0, "context_used"] == 8 and used.loc[0, "used_low"] <= 8 <= used.loc[0, "used_high"]
    # a cell that no replacement changes uses no context: "none" per seed and for the cell, and its interval
    _, used = use_table({"b": np.zeros((2, 5, 400))}, distances, units, 0.95, {"b": [3, 4]}, n_boot=50)
    assert used.loc[0, "context_used"] is None and used.loc[0, "context_used_per_seed"] == "none, none"
    assert used.loc[0, "used_low"] is None and used.loc[0, "used_high"] is None


def test_partners_share_no_unit_and_too_few_units_are_named():
    units = np.repeat(np.arange(8), 4).reshape(8, 4)  # row r holds unit r
    other = partners(units)
    assert (other != np.arange(8)).all() and (other == (np.arange(8) + 4) % 8).all()
    with pytest.raises(RunError, match="shares a unit with every other row"):
        partners(np.zeros((4, 3), dtype=int))


def test_the_grid_reaches_four_spans_and_bad_settings_are_named():
    s = PerturbationSettings(n_rows=8, distances=None, ngram=8, batch_tokens=4096)
    grid = s.grid(32, 32)
    assert grid[0] == 0 and grid[-1] == 256 and {32, 64, 128, 192, 256} <= set(grid)
    with pytest.raises(ValueError, match="n_rows must be >= 2"):
        PerturbationSettings(n_rows=1, distances=None, ngram=8, batch_tokens=4096)
    with pytest.raises(ValueError, match=r"distances must be null or non-negative integers, got \[-1\]"):
        PerturbationSettings(n_rows=4, distances=[-1], ngram=8, batch_tokens=4096)
