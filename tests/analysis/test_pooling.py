"""One seed variance per measure (posenc_lab_analysis.pooling): the pooled interval holds its level when the seed
SDs are equal and is narrower than each cell's own; the test refuses to pool when they clearly differ; the verdicts
pool where conf/paper.yaml asks; and the power at the measured size says what the 80% point cannot."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from posenc_lab.cellnames import CellName
from posenc_lab_analysis.pooling import seed_pooling
from posenc_lab_analysis.stats import paired_difference
from posenc_lab_analysis.verdicts import Evidence, judge, paper

UNITS = np.repeat(np.arange(20), 10)
CELLS = [f"c{i}" for i in range(6)]


def study(rng, sds: list[float], seeds: int = 2, text_sd: float = 0.002) -> Evidence:
    """Cells of true mean 0 on the same 200 tokens in 20 units: a seed effect of each cell's SD (dominant), a small
    unit effect of each cell, token noise."""
    cells = {}
    for name, sd in zip(CELLS, sds):
        unit = rng.normal(0, text_sd, 20)[UNITS]
        cells[name] = unit + rng.normal(0, sd, (seeds, 1)) + rng.normal(0, 0.01, (seeds, len(UNITS)))
    return Evidence(cells, {c: CellName(c, 0) for c in cells}, UNITS)


def test_the_pooled_interval_holds_its_level_at_equal_seed_sds_and_is_narrower():
    """Six cells of 2 seeds, one seed SD: the 90% interval of c0 - c1 with the pooled seed variance (6 df) covers
    the truth about 90% of the time, where each cell's own (1 df each, capped at 1) is far wider."""
    rng = np.random.default_rng(0)
    covered, pooled_width, own_width, pooled_at = [], [], [], 0
    for _ in range(400):
        ev = study(rng, [0.02] * 6)
        test = seed_pooling("as_trained", ev, 0.05)
        pooled_at += test.pooled
        seed_var = test.seed_var or (test.variance, float(test.df))  # the interval itself, whatever the test says
        d = paired_difference(ev.cells["c0"], ev.cells["c1"], UNITS, 0.9, seed_var=seed_var)
        own = paired_difference(ev.cells["c0"], ev.cells["c1"], UNITS, 0.9)
        covered.append(d.low <= 0 <= d.high)
        pooled_width.append(d.high - d.low)
        own_width.append(own.high - own.low)
        assert d.df > own.df
    assert 0.86 <= np.mean(covered) <= 0.94  # 400 draws: the standard error of 0.9 is 0.015
    assert pooled_at >= 0.9 * 400  # equal SDs: the test pools (it rejects at about its 5%)
    assert np.median(pooled_width) < 0.5 * np.median(own_width)


def test_the_test_refuses_to_pool_when_the_seed_sds_clearly_differ():
    """Three cells of seed SD 0.002 and three of 0.05 (a ratio of 25), 3 seeds each: Bartlett's test rejects equal
    variances in nearly every study, and each cell keeps its own."""
    rng = np.random.default_rng(1)
    refused = [not seed_pooling("m", study(rng, [0.002] * 3 + [0.05] * 3, seeds=3), 0.05).pooled for _ in range(200)]
    assert np.mean(refused) >= 0.9
    test = seed_pooling("m", study(rng, [0.002] * 3 + [0.05] * 3, seeds=3), 0.05)
    if not test.pooled:
        assert test.seed_var is None and "the seed SDs differ" in test.text()


def test_the_test_needs_two_cells_with_a_spread_and_a_bad_alpha_is_one_line():
    rng = np.random.default_rng(2)
    ev = study(rng, [0.02] * 6)
    one = Evidence({"c0": ev.cells["c0"], "c1": ev.cells["c1"][:1]}, ev.keys, UNITS)  # c1: one seed
    test = seed_pooling("m", one, 0.05)
    assert not test.pooled and test.seed_var is None and "fewer than 2 cells" in test.text()
    with pytest.raises(ValueError, match=r"seed_variance.test_alpha must be in \(0, 1\), e.g. 0.05, got 1.5"):
        seed_pooling("m", ev, 1.5)
    with pytest.raises(ValueError, match=r"seed_var must be"):
        paired_difference(ev.cells["c0"], ev.cells["c1"], UNITS, 0.9, seed_var=(0.1, 0))


def test_the_verdicts_pool_where_paper_yaml_asks_and_the_report_says_so():
    """seed_variance.pool true: a verdict on 2-seed cells of one seed SD is judged with the pool's df; false (conf/
    paper.yaml's default) or absent: with each cell's own, the test still reported where the block is there."""
    assert paper()["seed_variance"] == {"pool": False, "test_alpha": 0.05}
    rng = np.random.default_rng(3)
    ev = study(rng, [0.02] * 6)
    ev.cells["c0"] = ev.cells["c0"] - 0.2  # a planted difference
    spec = {"id": "v", "claim": "v", "measure": "as_trained", "compare": ["c0:nomem - c1:nomem"], "predict": "<0"}
    pooled, _ = judge({"alpha": 0.05, "verdicts": [spec], "seed_variance": {"pool": True}}, {"as_trained": ev})
    own, _ = judge({"alpha": 0.05, "verdicts": [spec]}, {"as_trained": ev})
    assert pooled[0].pooling.pooled and pooled[0].comparisons[0].difference.df > own[0].comparisons[0].difference.df
    assert own[0].pooling is None
    assert "one seed SD" in pooled[0].pooling.text() and "on 6 df, pooled" in pooled[0].pooling.text()
    off, _ = judge({"alpha": 0.05, "verdicts": [spec], "seed_variance": {"pool": False}}, {"as_trained": ev})
    assert off[0].pooling.pooled and off[0].pooling.seed_var is None and "not pooled" in off[0].pooling.text()
    assert off[0].comparisons[0].difference.df == own[0].comparisons[0].difference.df


def test_at_unequal_seed_sds_the_test_cannot_see_pooling_undercovers_the_noisiest_cell():
    """Why pooling is off by default: seed SDs as measured on the default ablation (0.0075 for one cell, 0.002 for
    the rest; 2 seeds) pass the test in most studies, and the pooled interval of the noisiest cell against another
    covers well under its 90%, where each cell's own holds it."""
    rng = np.random.default_rng(5)
    pooled_cover, own_cover, passed = [], [], 0
    for _ in range(300):
        ev = study(rng, [0.0075] + [0.002] * 5, text_sd=0.0)
        test = seed_pooling("m", ev, 0.05)
        passed += test.pooled
        d = paired_difference(ev.cells["c0"], ev.cells["c1"], UNITS, 0.9, seed_var=(test.variance, float(test.df)))
        own = paired_difference(ev.cells["c0"], ev.cells["c1"], UNITS, 0.9)
        pooled_cover.append(d.low <= 0 <= d.high)
        own_cover.append(own.low <= 0 <= own.high)
    assert passed >= 0.5 * 300 and np.mean(pooled_cover) < 0.8 <= np.mean(own_cover)


def test_power_at_the_measured_size_grows_with_it_and_tells_what_the_80_percent_point_hides():
    from posenc_lab_analysis.power import verdict_detectable, verdict_power

    rng = np.random.default_rng(4)
    ev = study(rng, [0.02] * 6)
    d = paired_difference(ev.cells["c0"], ev.cells["c1"], UNITS, 0.9)
    low = verdict_power([replace(d, estimate=0.0)], [False], [0.0], UNITS, 0.05)
    big = verdict_power([replace(d, estimate=50 * d.se)], [False], [0.0], UNITS, 0.05)
    assert 0 <= low < 0.2 and big > 0.95
    at80 = verdict_detectable([d], [False], UNITS, 0.05)
    at = verdict_power([replace(d, estimate=at80)], [False], [0.0], UNITS, 0.05)
    assert at == pytest.approx(0.8, abs=0.03)  # the same draws: the 80% point has power 0.8
