"""Retrieval reach (analysis/reach.py, the `reach` section, conf/experiment/reach.yaml): the estimator and its
permutation null on planted answers (a window-only cell never reaches past its window more often than the stated
level allows), and the tiny preset end to end."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from posenc_lab_analysis.reach import Answers, above_null, bin_intervals, per_seed, reach, reach_interval

N_VALUES = 16
CHANCE = 1 / N_VALUES
SKEWED = np.r_[0.3, np.full(N_VALUES - 1, 0.7 / (N_VALUES - 1))]  # one value common: chance is not 1 / n_values


def planted(recall, n: int = 4000, seeds: int = 2, far: int = 300, seed: int = 0, values=None, guesses=None) -> Answers:
    """Answers at distances 2..far, 4 to a unit: each seed answers its item's value with probability recall(D) and
    otherwise guesses (lucky hits included): a value drawn from ``guesses`` (None: uniform), or the one value
    ``guesses`` if it is an int (every seed alike). The values are drawn from ``values`` (None: uniform)."""
    rng = np.random.default_rng(seed)
    d = rng.integers(2, far + 1, n)
    value = rng.choice(N_VALUES, n, p=values)
    if isinstance(guesses, int):
        guess = np.full((seeds, n), guesses)
    else:
        guess = rng.choice(N_VALUES, (seeds, n), p=guesses)
    predicted = np.where(rng.random((seeds, n)) < recall(d), value[None], guess)
    return Answers(predicted, value, d, np.arange(n) // 4)


def test_reach_reads_the_planted_distance_and_none_where_nothing_is_recalled():
    high_to_100 = planted(lambda d: np.where(d <= 100, 0.9, 0))
    r = reach_interval(high_to_100, 20, 0.95, n_boot=50)
    assert r.estimate == 100 and r.low <= 100 <= r.high and r.text().startswith("100")
    assert per_seed(high_to_100, 20, 0.95) == [100, 100]
    # a weaker, decaying recall: the reach lies where it fades, and its interval spans that
    fading = planted(lambda d: np.clip(0.9 - d / 150, 0, 1), n=6000)
    r = reach_interval(fading, 10, 0.95, n_boot=50)
    assert 60 <= r.low <= r.estimate <= r.high <= 130
    never = reach_interval(planted(lambda d: np.zeros(d.shape)), 20, 0.95, n_boot=50)
    assert never.estimate == 0 and never.text().startswith("none")


def test_a_cell_that_answers_up_to_d_reaches_the_bin_of_d():
    """Recall 0.8 up to a planted D (not on a bin's edge), guesses beyond: the reach ends in D's bin or the one
    before (the bin holding D is part recall, part chance)."""
    width = 20
    for k, D in enumerate(np.random.default_rng(7).integers(30, 250, 6)):
        r = reach(planted(lambda d, D=D: np.where(d <= D, 0.8, 0), n=3000, seed=k), width, 0.95, n_perm=1000)
        assert D - width <= r < D + width, (D, r)


def test_a_window_only_cell_never_reaches_past_its_window_more_often_than_the_level_allows():
    """200 studies of a cell that answers only within its window of 16 and guesses beyond it: uniform guesses of
    uniform values, guesses of skewed values from the same skew (lucky hits at about 0.12, twice 1 / n_values), or
    the common value always, by every seed. The reach, its interval's upper end and the farthest bin above the
    null pass the window in at most 5% of studies (level 0.95), though the skewed studies' hits past the window
    lie far above 1 / n_values (a fixed chance of 1 / n_values would call them recall)."""
    window, width, level, studies = 16, 16, 0.95, 200
    past_estimate = past_high = past_farthest = 0
    lucky, estimated = [], []
    for k in range(studies):
        values, guesses = [(None, None), (SKEWED, SKEWED), (SKEWED, 0)][k % 3]
        a = planted(lambda d: (d <= window).astype(float), n=600, far=160, seed=k, values=values, guesses=guesses)
        t = above_null(a, width, level, n_perm=1000, seed=k)
        r = reach_interval(a, width, level, n_boot=30, seed=k, table=t)
        past_estimate += r.estimate > window
        past_high += r.high > window
        past_farthest += bool((t["above"] & (t["bin_lo"] >= window)).any())
        if values is not None:
            beyond = t[t["bin_lo"] >= window]
            lucky.append(beyond["accuracy"].mean())
            estimated.append(beyond["chance"].mean())
    allowed = (1 - level) * studies
    assert past_estimate <= allowed and past_high <= allowed and past_farthest <= allowed
    assert np.mean(lucky) > 1.8 * CHANCE  # the lucky hits: far above a fixed 1 / n_values
    assert np.mean(estimated) == pytest.approx(np.mean(lucky), abs=0.01)  # and the estimated chance is theirs


def test_the_estimated_chance_is_the_predictions_share_times_the_values_share():
    """One seed always answering value 0, values of one bin 0, 0, 1, 2: chance 1 x 1/2, whatever 1 / n_values; a
    permutation cannot beat the true pairing, so the bin is not above."""
    a = Answers(np.zeros((1, 4), int), np.array([0, 0, 1, 2]), np.array([3, 4, 5, 6]), np.arange(4))
    t = above_null(a, 16, 0.95, n_perm=200)
    assert t["chance"].item() == pytest.approx(0.5) and t["accuracy"].item() == pytest.approx(0.5)
    assert t["p_value"].item() == 1 and not t["above"].item()


def test_a_far_bin_high_by_chance_does_not_extend_the_reach_and_the_last_bin_is_censored():
    a = planted(lambda d: np.where(d <= 100, 0.9, np.where((d > 240) & (d <= 260), 0.5, 0)))
    t = above_null(a, 20, 0.95)
    assert t.loc[t["bin_hi"] == 260, "above"].item()  # the farthest bin above chance, read as such
    assert reach(a, 20, 0.95) == 100  # but the reach is where recall stops
    everywhere = reach_interval(planted(lambda d: np.full(d.shape, 0.9)), 20, 0.95, n_boot=20)
    assert everywhere.censored and everywhere.text().startswith(">= 300")


def test_bin_intervals_cover_the_planted_accuracy_and_never_collapse():
    a = planted(lambda d: np.where(d <= 100, 0.6, 0.3), n=8000, seeds=3)
    t = bin_intervals(a, 50, 0.95)
    truth = np.where(t["bin_hi"] <= 100, 0.6, 0.3) + np.where(t["bin_hi"] <= 100, 0.4, 0.7) * CHANCE  # lucky hits
    assert ((t["low"] < truth) & (truth < t["high"])).all()
    assert (t["seed_sd"] > 0).all() and (t["seed_sd"] < 0.1).all()  # 3 seeds, each a binomial draw of ~800
    # two answers, both right for both seeds: an interval still (Wilson), not the point 1
    tiny = bin_intervals(Answers(np.ones((2, 2), int), np.ones(2, int), np.array([5, 6]), np.array([0, 1])), 16, 0.95)
    assert tiny["high"].item() == pytest.approx(1.0) and 0.2 < tiny["low"].item() < 0.9


def test_answers_whose_value_was_planted_before_the_stream_are_left_out(tmp_path):
    from posenc_lab_analysis.dumps import TokenLosses, _write, read_dump
    from posenc_lab_analysis.reach import answers

    distance = np.full((1, 12), -1)
    distance[0, [3, 6, 11]] = [5, 6, 4]  # target 3 asks for a value 5 back: before the stream
    target = np.arange(12)[None] % 7
    predicted = np.where(np.arange(12) == 11, 99, target)[None]  # target 11 answered wrong
    dump = TokenLosses(
        loss=np.zeros((1, 1, 12)),
        correct=np.ones((1, 1, 12), bool),
        documents=np.zeros((1, 12)),
        units=np.arange(12)[None],
        scored=distance >= 0,
        distance=distance,
        contexts=[16],
        meta={},
        predicted=predicted,
        target=target,
    )

    class R:
        name = "r"

    a = answers([R()], {"r": dump})
    assert a.distance.tolist() == [6, 4] and a.units.tolist() == [6, 11]
    assert a.value.tolist() == [6, 4] and a.correct.tolist() == [[1.0, 0.0]]
    # the predictions travel through the dump's file
    write = tmp_path / "r.npz"
    _write(write, dump)
    again = read_dump(write)
    assert np.array_equal(again.predicted, predicted) and np.array_equal(again.target, target)
    with pytest.raises(ValueError, match="holds no predictions"):
        answers([R()], {"r": TokenLosses(**{**dump.__dict__, "predicted": None})})


@pytest.mark.parametrize("bad", [0, -3])
def test_a_bad_bin_width_or_replicate_count_is_one_line(bad):
    from posenc_lab_analysis.report import ReportSettings
    from posenc_lab_analysis.settings import conf_block

    with pytest.raises(ValueError, match=rf"bin width must be >= 1 distance, got {bad}$"):
        reach(planted(lambda d: np.full(d.shape, 0.5), n=50), bad, 0.95)
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
