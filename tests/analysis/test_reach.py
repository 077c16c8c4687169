"""Retrieval reach (analysis/reach.py, the `reach` section, conf/experiment/reach.yaml): the estimator on planted
accuracies, and the tiny preset end to end."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from posenc_lab_analysis.reach import Answers, above_chance, bin_intervals, per_seed, reach, reach_interval

CHANCE = 1 / 16


def planted(accuracy, n: int = 4000, seeds: int = 2, far: int = 300, seed: int = 0) -> Answers:
    """Answers at distances 2..far, 4 to a unit, each seed hitting with probability accuracy(D)."""
    rng = np.random.default_rng(seed)
    d = rng.integers(2, far + 1, n)
    correct = (rng.random((seeds, n)) < accuracy(d)).astype(np.float64)
    return Answers(correct, d, np.arange(n) // 4)


def test_reach_reads_the_planted_distance_and_none_where_nothing_is_recalled():
    high_to_100 = planted(lambda d: np.where(d <= 100, 0.9, CHANCE))
    r = reach_interval(high_to_100, 20, CHANCE, 0.95, n_boot=50)
    assert r.estimate == 100 and r.low <= 100 <= r.high and r.text().startswith("100")
    assert per_seed(high_to_100, 20, CHANCE, 0.95) == [100, 100]
    # a weaker, decaying recall: the reach lies where it fades, and its interval spans that
    fading = planted(lambda d: np.clip(0.9 - d / 150, CHANCE, 1), n=6000)
    r = reach_interval(fading, 10, CHANCE, 0.95, n_boot=50)
    assert 60 <= r.low <= r.estimate <= r.high <= 130
    never = reach_interval(planted(lambda d: np.full(d.shape, CHANCE)), 20, CHANCE, 0.95, n_boot=50)
    assert never.estimate == 0 and never.text().startswith("none")


def test_a_far_bin_high_by_chance_does_not_extend_the_reach_and_the_last_bin_is_censored():
    a = planted(lambda d: np.where(d <= 100, 0.9, np.where((d > 240) & (d <= 260), 0.5, CHANCE)))
    t = above_chance(a, 20, CHANCE, 0.95)
    assert t.loc[t["bin_hi"] == 260, "above"].item()  # the farthest bin above chance, read as such
    assert reach(a, 20, CHANCE, 0.95) == 100  # but the reach is where recall stops
    everywhere = reach_interval(planted(lambda d: np.full(d.shape, 0.9)), 20, CHANCE, 0.95, n_boot=20)
    assert everywhere.censored and everywhere.text().startswith(">= 300")


def test_bin_intervals_cover_the_planted_accuracy_and_never_collapse():
    a = planted(lambda d: np.where(d <= 100, 0.6, 0.3), n=8000, seeds=3)
    t = bin_intervals(a, 50, 0.95)
    truth = np.where(t["bin_hi"] <= 100, 0.6, 0.3)
    assert ((t["low"] < truth) & (truth < t["high"])).all()
    assert (t["seed_sd"] > 0).all() and (t["seed_sd"] < 0.1).all()  # 3 seeds, each a binomial draw of ~800
    # two answers, both right for both seeds: an interval still (Wilson), not the point 1
    tiny = bin_intervals(Answers(np.ones((2, 2)), np.array([5, 6]), np.array([0, 1])), 16, 0.95)
    assert tiny["high"].item() == pytest.approx(1.0) and 0.2 < tiny["low"].item() < 0.9


def test_answers_whose_value_was_planted_before_the_stream_are_left_out():
    from posenc_lab_analysis.dumps import TokenLosses
    from posenc_lab_analysis.reach import answers

    distance = np.full((1, 12), -1)
    distance[0, [3, 6, 11]] = [5, 6, 4]  # target 3 asks for a value 5 back: before the stream
    dump = TokenLosses(
        loss=np.zeros((1, 1, 12)),
        correct=np.ones((1, 1, 12), bool),
        documents=np.zeros((1, 12)),
        units=np.arange(12)[None],
        scored=distance >= 0,
        distance=distance,
        contexts=[16],
        meta={},
    )

    class R:
        name = "r"

    a = answers([R()], {"r": dump})
    assert a.distance.tolist() == [6, 4] and a.units.tolist() == [6, 11]


@pytest.mark.parametrize("bad", [0, -3])
def test_a_bad_bin_width_or_replicate_count_is_one_line(bad):
    from posenc_lab_analysis.report import ReportSettings
    from posenc_lab_analysis.settings import conf_block

    with pytest.raises(ValueError, match=rf"bin width must be >= 1 distance, got {bad}$"):
        reach(planted(lambda d: np.full(d.shape, 0.5), n=50), bad, CHANCE, 0.95)
    for key, message in (("bin_width", r"bin_width must be >= 1 \(or null: L\)"), ("n_boot", "n_boot must be >= 20")):
        block = conf_block()
        block["reach"][key] = bad
        with pytest.raises(ValueError, match=rf"^ablate.analysis.reach.{message}.*, got {bad}$"):
            ReportSettings.read(block)


@pytest.mark.slow
def test_the_tiny_reach_preset_reports_the_heatmap_and_the_reach_table(tmp_path):
    from posenc_lab import ablate

    out = tmp_path / "reach_tiny"
    assert ablate.main(["experiment=reach_tiny", f"ablate.out={out}"]) == 0
    report = out / "report"
    text = (report / "report.md").read_text()
    assert "Retrieval reach" in text and "table_reach.csv" in text and "reach_heatmap.png" in text
    t = pd.read_csv(report / "table_reach.csv")
    assert set(t["cell"]) == {"recall/xl:mem16", "recall/xl:nomem", "recall/nope:mem16", "recall/nope:nomem"}
    assert (t["farthest_evaluated"] > 96).all()  # evaluated past the training range (32) and N_layer (L + M)
    assert (report / "recall" / "reach_heatmap.png").stat().st_size > 5000
    bins = pd.read_csv(report / "recall" / "reach_accuracy.csv")
    assert (
        bins["bin_hi"].max() == 160 and ((bins["low"] <= bins["accuracy"]) & (bins["accuracy"] <= bins["high"])).all()
    )
