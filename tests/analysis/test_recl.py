"""RECL (posenc_lab_analysis.recl) on simulated groups with a known answer: the leave-one-out baseline and
the monotone fit recover a planted effective context, and noise cannot fake a gain."""

from __future__ import annotations

import numpy as np
import pytest

from posenc_lab_analysis.recl import _stack, first_below, monotone, recl, recl_text, reference, seed_gains

KW = dict(threshold=0.01, level=0.95)  # the paper's 1% and the intervals these tests read

CONTEXTS = list(range(8, 129, 8))  # c = 8..128, delta 8
N_TOKENS, DOC_LEN = 4096, 256


def model(rng, base, knee: int | None, drop: float = 0.1, noise: float = 0.05, offset: float = 0.0) -> np.ndarray:
    """[1 seed, n_c, n_tokens] losses that fall by ``drop`` nats per step of c up to ``knee`` (None: never), then
    stay flat; ``noise``: per-token noise, independent across c (what differs between two evaluations)."""
    steps = np.array([min(c, knee) if knee else CONTEXTS[0] for c in CONTEXTS]) - CONTEXTS[0]
    level = offset - drop * steps / 8
    return (base[None] + level[:, None] + rng.normal(0, noise, (len(CONTEXTS), N_TOKENS)))[None]


def group(rng, knees=(48, 96, 24), **kw) -> dict[str, np.ndarray]:
    base = rng.gamma(2.0, 1.0, N_TOKENS)  # per-token difficulty shared by every model
    return {f"m{i}": model(rng, base, k, **kw) for i, k in enumerate(knees)}


DOCS = np.arange(N_TOKENS) // DOC_LEN


def point(per_seed: dict) -> dict:
    res = recl(per_seed, CONTEXTS, DOCS, **KW, n_boot=0, r_values=(0.5,))
    return dict(zip(res.table["model"], res.table["recl"]))


def test_a_planted_recl_is_recovered_within_one_grid_step():
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(40):
        found = point(group(rng))
        hits += all(abs(found[m] - k) <= 8 for m, k in zip(("m0", "m1", "m2"), (48, 96, 24)))
    assert hits / 40 >= 0.8


def _paper_gain_of(stack: np.ndarray, m: int, k: int, k2: int, r: float = 0.5) -> float:
    """The paper's gain (its baseline includes the model itself), for contrast."""
    b = stack[:, k].min(0)
    hard = np.argsort(-b, kind="stable")[: int(r * stack.shape[-1])]
    return 1 - np.exp(np.minimum(b[hard], stack[m, k2, hard]).mean() - b[hard].mean())


def test_noise_added_to_a_model_that_gains_nothing_gives_it_no_gain():
    """A model whose loss does not fall with context, made noisier: RECL stays at the first c; the paper's
    baseline, which contains the model itself, credits its noise with a gain at every c."""
    rng = np.random.default_rng(1)
    found, paper = [], []
    for _ in range(20):
        g = group(rng, knees=(64, 96, None))
        base_noisy = g["m2"] + rng.normal(0, 0.4, g["m2"].shape)  # much noisier, still no gain
        g["m2"] = base_noisy
        found.append(point(g)["m2"])
        stack = np.stack([x[0] for x in g.values()])
        paper.append(_paper_gain_of(stack, 2, 4, 5))
    assert np.mean([f == CONTEXTS[0] for f in found]) >= 0.9
    assert np.mean(paper) > 0.01  # what the paper's estimator would have credited


def test_a_far_worse_model_gains_nothing_from_its_noise():
    rng = np.random.default_rng(2)
    g = group(rng, knees=(64, 96))
    base = rng.gamma(2.0, 1.0, N_TOKENS)
    g["far"] = model(rng, base, None, noise=0.6, offset=1.5)  # far worse, flat, noisy
    assert point(g)["far"] == CONTEXTS[0]


def test_the_monotone_fit_ignores_a_dip_in_a_noisy_curve():
    """A gain curve 5% 5% 0.5% 5% 5% 0% ...: read raw, it stops at the dip; fitted non-increasing, later."""
    raw = np.array([0.05, 0.05, 0.005, 0.05, 0.05, 0.0, 0.0])[:, None, None]
    pairs = [(k, k + 1) for k in range(7)]
    served = np.ones((1, 8), bool)
    stop_raw, _ = first_below(raw, served, list(range(8, 72, 8)), pairs, 0.01)
    stop_fit, _ = first_below(monotone(raw), served, list(range(8, 72, 8)), pairs, 0.01)
    assert stop_raw[0, 0] == 24 and stop_fit[0, 0] == 48


def test_a_model_alone_has_no_baseline_and_unserved_contexts_are_nan():
    rng = np.random.default_rng(3)
    g = group(rng)
    g["m2"][:, 5:] = np.nan  # m2 cannot serve c >= 48
    names, ref, served = _stack(reference(g), CONTEXTS)
    found = seed_gains(g, names, ref, served, [(4, 5), (5, 6)], (0.5,))
    assert np.isnan(found["m2"]).all() and all(np.isfinite(found[m]).all() for m in ("m0", "m1"))
    alone = {"m0": g["m0"]}
    names, ref, served = _stack(reference(alone), CONTEXTS)
    assert np.isnan(seed_gains(alone, names, ref, served, [(4, 5)], (0.5,))["m0"]).all()


def test_bootstrap_intervals_and_the_paired_difference_of_two_cells():
    rng = np.random.default_rng(4)
    g = group(rng)
    g = {
        m: np.concatenate([x, x + rng.normal(0, 0.02, x.shape), x + rng.normal(0, 0.02, x.shape)]) for m, x in g.items()
    }
    res = recl(g, CONTEXTS, DOCS, **KW, n_boot=60, r_values=(0.5,))
    t = res.table.set_index("model")
    for m in ("m0", "m1", "m2"):
        assert t.loc[m, "recl_low"] <= t.loc[m, "recl"] <= t.loc[m, "recl_high"]
    est, lo, hi = res.difference("m1", "m2", 0.5, 0.95)
    assert est == t.loc["m1", "recl"] - t.loc["m2", "recl"] and lo <= est <= hi and lo > 0
    curves = res.curves
    assert {"gain", "fitted", "band_low", "band_high"} <= set(curves) and (
        curves["band_low"] <= curves["band_high"] + 1e-12
    ).all()


def test_censored_and_text():
    assert recl_text(float("nan"), False) == "n/a" and recl_text(128.0, True) == ">128" and recl_text(64, False) == "64"
    rng = np.random.default_rng(5)
    res = recl(group(rng, knees=(None, None, 200)), CONTEXTS, DOCS, **KW, n_boot=0, r_values=(0.5,))
    row = res.table.set_index("model").loc["m2"]
    assert bool(row["censored"]) and row["recl"] == CONTEXTS[-2]


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="strictly increasing"):
        recl({"a": np.zeros((1, 2, 10))}, [16, 8], np.zeros(10, int), r_values=(1.0,), n_boot=0, **KW)
    with pytest.raises(ValueError, match=r"must be \[len\(contexts\)=3, n_tokens\]"):
        recl({"a": np.zeros((1, 2, 10))}, [8, 16, 24], np.zeros(10, int), r_values=(1.0,), n_boot=0, **KW)
    with pytest.raises(ValueError, match="NaN losses for some tokens at c = 16"):
        x = np.zeros((1, 3, 10))
        x[0, 1, 3] = np.nan
        recl({"a": x, "b": np.zeros((1, 3, 10))}, [8, 16, 24], np.arange(10), r_values=(1.0,), n_boot=0, **KW)


def test_the_recl_section_says_what_its_seeds_can_cover():
    from posenc_lab_analysis.sections.recl import seed_caveat

    one_seed = seed_caveat({"xl:mem32": ["run0"], "shaw:mem32": ["run0"]})
    three_seeds = seed_caveat({"xl:mem32": ["a", "b", "c"], "shaw:mem32": ["a"]})
    assert "text only" in one_seed and "too narrow" not in one_seed
    assert "3 values" in three_seeds and "text only" not in three_seeds


# ---- RECL that can resolve memory ----------------------------------------------------------------------------


def test_the_interpolated_crossing_reads_between_grid_points():
    from posenc_lab_analysis.recl import crossing

    c = [8, 16, 24, 32]
    assert crossing([0.05, 0.03, 0.005, 0.0], c, 0.01) == pytest.approx((16 + 8 * (0.03 - 0.01) / 0.025, False))
    assert crossing([0.005, 0.0, 0.0, 0.0], c, 0.01) == (8.0, False)
    assert crossing([0.05, 0.04, 0.03, 0.02], c, 0.01) == (32.0, True)  # censored: the truth is larger


def test_no_interval_narrower_than_the_grid_step_reads_as_certainty():
    from posenc_lab_analysis.recl import interval_text

    assert interval_text(0.0, 0.0, 0.0, 8) == "+0 (within one step of 8 tokens: the grid cannot resolve it)"
    assert interval_text(16.0, -8.0, 40.0, 8) == "+16 [-8, +40]"


def test_the_recl_table_marks_the_grid_floor_and_intervals_narrower_than_a_step():
    """A cell that gains nothing reads '<=8' (below the threshold at the first c tested: the truth may be smaller,
    not exactly 8), and so does its crossing; an interval narrower than the step is starred, never bare."""
    from posenc_lab_analysis.sections.recl import table

    rng = np.random.default_rng(3)
    res = recl(group(rng, knees=(64, 96, None), noise=0.01), CONTEXTS, DOCS, **KW, n_boot=50, r_values=(0.5,))
    rows = table(res, step=8).set_index("cell")
    assert rows.loc["m2", "recl_r0.5"] == "<=8" and rows.loc["m2", "crossing_r0.5"] == "<=8"
    assert rows.loc["m2", "interval_r0.5"] == "[8, 8]*"
    assert rows.loc["m1", "recl_r0.5"] not in ("<=8", "8") and not rows.loc["m1", "recl_r0.5"].startswith("<=")
    for interval in rows["interval_r0.5"]:
        low, high = (int(x) for x in interval.strip("[]*").split(", "))
        assert interval.endswith("*") == (high - low < 8), interval


def _memory_group(rng, extra: float, seeds: int = 3):
    """Two cells that gain alike up to c = 32, one of which (``with``) keeps gaining ``extra`` nats per step up
    to c = 64, and a third that never gains; per-seed noise."""
    base = rng.gamma(2.0, 1.0, N_TOKENS)

    def cell(knee, drop):
        steps = np.array([min(c, knee) for c in CONTEXTS]) - CONTEXTS[0]
        level = -drop * steps / 8
        return np.stack(
            [base[None] + level[:, None] + rng.normal(0, 0.05, (len(CONTEXTS), N_TOKENS)) for _ in range(seeds)]
        )

    with_memory = cell(32, 0.05)
    with_memory = with_memory - extra * np.clip(np.array(CONTEXTS) - 32, 0, 32)[None, :, None] / 8
    return {"with": with_memory, "without": cell(32, 0.05), "flat": cell(8, 0.0)}


def test_the_area_under_the_gain_curve_resolves_a_small_memory_effect_and_holds_its_level():
    """A with-minus-without memory difference of 0.004 nats per step of 8 tokens between c = 32 and 64 (RECL at
    1% moves by less than a step): the area, judged with paired_difference over seeds and units, finds it in most
    simulated groups, and at no difference rejects at about its level."""
    from posenc_lab_analysis.recl import area_per_token
    from posenc_lab_analysis.stats import paired_difference

    rng = np.random.default_rng(30)
    found = false = 0
    for _ in range(10):
        for extra, counter in ((0.004, "found"), (0.0, "false")):
            area = area_per_token(_memory_group(rng, extra), CONTEXTS, r=1.0)
            d = paired_difference(area["with"], area["without"], DOCS, 0.95)
            if d.p_value(">0") < 0.05:
                found += counter == "found"
                false += counter == "false"
    assert found >= 8 and false <= 2


def test_a_seeds_recl_and_area_do_not_depend_on_how_many_seeds_any_cell_has():
    """Each seed against the other cells' first seeds: a cell of 2 seeds or of 3, and another cell of 2 or 3,
    give every seed the same RECL, crossing and area (a cell's RECL must not depend on its seed count;
    against seed means the baseline's noise fell with every seed added)."""
    from posenc_lab_analysis.recl import area_per_token

    rng = np.random.default_rng(31)
    three = _memory_group(rng, 0.004, seeds=3)
    two = {m: x[:2] for m, x in three.items()}
    fewer_elsewhere = {**three, "without": three["without"][:2]}

    def seeds(cells):
        t = recl(cells, CONTEXTS, DOCS, **KW, n_boot=0, r_values=(0.5, 1.0)).per_seed
        return t.set_index(["model", "seed", "r"])[["recl", "crossing"]]

    full = seeds(three)
    for fewer in (two, fewer_elsewhere):
        part = seeds(fewer)
        assert np.array_equal(full.loc[part.index].to_numpy(), part.to_numpy(), equal_nan=True)
        area = area_per_token(fewer, CONTEXTS)
        for m, x in area_per_token(three, CONTEXTS).items():
            assert np.array_equal(x[: len(area[m])], area[m])
    assert len(full) == 3 * 3 * 2 and (full["recl"] > CONTEXTS[0]).any()
    # the cell's value is the mean of its seeds', which a third seed moves only by its own value
    cell = recl(three, CONTEXTS, DOCS, **KW, n_boot=0, r_values=(1.0,)).table.set_index("model")["recl"]
    assert cell["with"] == pytest.approx(full.xs(1.0, level="r").loc["with", "recl"].mean())


def test_memory_areas_stop_at_the_longest_context_both_cells_serve():
    """The report's smooth estimand (recl.memory_areas): a memory gain between c = 32 and 64 is found over
    seeds and units; the area stops at the longest c the cell without memory serves (a window cap at 48 leaves
    half the extra gain out, so the difference is smaller, still found); no pair served twice is no line."""
    from posenc_lab_analysis.recl import memory_areas

    group = _memory_group(np.random.default_rng(3), 0.02)
    everywhere = {m: list(CONTEXTS) for m in group}
    ((a, b, c_max, full),) = memory_areas(group, CONTEXTS, DOCS, [("with", "without")], everywhere, 0.95)
    assert (a, b, c_max) == ("with", "without", CONTEXTS[-1]) and full.low > 0 and full.covers_seeds
    capped = {**everywhere, "without": [c for c in CONTEXTS if c <= 48]}
    ((_, _, c_cap, part),) = memory_areas(group, CONTEXTS, DOCS, [("with", "without")], capped, 0.95)
    assert c_cap == 48 and 0 < part.low and part.estimate < 0.75 * full.estimate
    assert memory_areas(group, CONTEXTS, DOCS, [("with", "without")], {**everywhere, "without": [8]}, 0.95) == []


def _knee_cell(rng, base, contexts, knee: int, seeds: int = 2, noise: float = 0.02) -> np.ndarray:
    """[seeds, n_c, n_tokens]: loss falls 0.1 nats per 8 tokens of context up to ``knee``, then stays flat."""
    level = -0.1 * (np.minimum(contexts, knee) - contexts[0]) / 8
    return np.stack(
        [base[None] + level[:, None] + rng.normal(0, noise, (len(contexts), N_TOKENS)) for _ in range(seeds)]
    )


def test_a_finer_grid_step_reads_recl_between_the_gain_increments():
    """The grid at step 4 with the gain's delta kept at 8 (ablate.analysis.context.step): the first-below RECL
    lands on the 4-token grid, at the planted knee within a step, and the interpolated crossing (descriptive) lies
    between the grid points around it, inside its own bootstrap interval."""
    rng = np.random.default_rng(7)
    fine = np.array(range(8, 129, 4))
    base = rng.gamma(2.0, 1.0, N_TOKENS)
    cells = {
        "a": _knee_cell(rng, base, fine, 60),
        "b": _knee_cell(rng, base, fine, 100),
        "c": _knee_cell(rng, base, fine, 8),
    }
    res = recl(cells, list(fine), DOCS, delta=8, **KW, n_boot=60, r_values=(1.0,))
    row = res.table.set_index("model").loc["a"]
    # the gain g(c, c + 8) falls below 1% once c reaches the knee: 60, a point of the 4-token grid only
    assert row["recl"] == 60
    assert row["recl"] - 4 <= row["crossing"] <= row["recl"] and not row["crossing_censored"]
    assert row["crossing_low"] <= row["crossing"] <= row["crossing_high"]
    assert res.table.set_index("model").loc["b", "crossing"] > row["crossing"] + 30


def test_the_area_is_the_same_estimand_at_any_grid_step():
    """area_per_token weighs each (c, c + delta) pair by step / delta: on noise-free cells, the area of the step-4
    grid equals that of the step-8 grid to within one half-increment at the ends."""
    from posenc_lab_analysis.recl import area_per_token

    rng = np.random.default_rng(8)
    base = rng.gamma(2.0, 1.0, N_TOKENS)
    areas = {}
    for step in (8, 4):
        grid = np.array(range(8, 129, step))
        cells = {m: _knee_cell(rng, base, grid, k, seeds=1, noise=0.0) for m, k in (("a", 64), ("b", 32), ("c", 8))}
        areas[step] = area_per_token(cells, list(grid))["a"].mean()
    assert areas[8] > 0.5  # 7 increments of 0.1 nats, capped by the others' best
    assert areas[4] == pytest.approx(areas[8], rel=0.1)


def _context(**kw):
    from posenc_lab_analysis.dumps import ContextSettings

    values = dict(n_rows=1, n_score=1, delta=8, step=4, c_min=None, coarse_from=None, c_max=None, window_max=None)
    return ContextSettings(**{**values, "n_boot": 50, "fraction": 0.01, **kw})


class _Run:
    segment_len, mem_len, train_attention_length, window = 32, 32, 64, False


def test_a_grid_step_that_does_not_divide_delta_is_refused_by_name():
    with pytest.raises(ValueError, match=r"context\.step must divide delta = 8.*got 3"):
        _context(step=3, c_max=64).grid([_Run()])
    assert _context(c_max=64).grid([_Run()]) == list(range(8, 65, 4))


def test_the_grid_reaches_four_times_the_attention_length_coarsely_past_2L():
    """By default c runs to 4 (L + M) = 256: every 4 tokens up to 2 L = 64, then doubling, each coarse c with
    c - delta beside it, so that RECL's gain g(c - delta, c) is measured there too; a window is evaluated as far
    as the grid goes (window_max: None)."""
    s = _context()
    assert s.grid([_Run()]) == [*range(8, 65, 4), 120, 128, 248, 256]
    assert s.evaluation([_Run()], "test").window_max == 256
    assert _context(coarse_from=32, c_max=100).grid([_Run()]) == [*range(8, 33, 4), 56, 64, 92, 100]
    with pytest.raises(ValueError, match="fraction must be in"):
        _context(fraction=1.5)


def test_hardest_tokens_are_the_first_of_a_stable_descending_sort_ties_included():
    """RECL's r-fraction of the hardest tokens, taken by a partition: the same set as the first k of the stable
    descending sort it replaces, when losses tie (integers) and when they do not."""
    from posenc_lab_analysis.recl import _hardest

    rng = np.random.default_rng(0)
    for trial in range(500):
        n = int(rng.integers(1, 40))
        b = rng.integers(0, 4, n).astype(float) if trial % 2 else rng.random(n)
        k = int(rng.integers(1, n + 1))
        taken = np.arange(n)[_hardest(b, k)]  # an index array, or every token (k = n)
        assert sorted(taken) == sorted(np.argsort(-b, kind="stable")[:k]), (b, k)


def test_an_area_that_was_not_evaluated_is_not_called_one_seed():
    """The RECL section's area line: a non-finite area reads "not evaluated", not "one seed a cell" (its
    Difference has no seed part either, but for another reason); a one-seed area keeps its label."""
    from types import SimpleNamespace

    from posenc_lab_analysis.sections.recl import area_lines
    from posenc_lab_analysis.stats import NOT_EVALUATED, paired_difference

    rng = np.random.default_rng(40)
    one = paired_difference(rng.normal(0, 1, (1, len(DOCS))), rng.normal(0, 1, (1, len(DOCS))), DOCS, 0.95)
    res = SimpleNamespace(areas=[("a", "b", 64, NOT_EVALUATED), ("c", "d", 64, one)])
    missing, single = area_lines(res, 8)
    assert "not evaluated" in missing and "one seed" not in missing
    assert "one seed a cell: the text only" in single
