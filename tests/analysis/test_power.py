"""The power statement (posenc_lab_analysis.power): the effect a verdict detects with 80% power, for the test as it
is run (its estimated degrees of freedom, Holm's level), from the seeds and units it had or planned from measured
components; and the plan counts the verdicts the report will judge."""

from __future__ import annotations

import re

import numpy as np
import pytest

from posenc_lab.cellnames import CellName
from posenc_lab_analysis.coverage import BEFORE, MEASURED, SPLIT, Simulator, designed
from posenc_lab_analysis.power import (
    _coarse,
    judged,
    plan_lines,
    planned,
    task_null_draws,
    task_plan_lines,
    verdict_detectable,
)
from posenc_lab_analysis.stats import paired_difference
from posenc_lab_analysis.verdicts import paper

ALPHA = 0.05 / 16  # Holm's first step with the default ablation's 8 judged verdicts


@pytest.mark.parametrize("n_seeds", [2, 3])
def test_the_stated_effect_is_found_with_its_power_by_the_test_as_run(n_seeds):
    """At the detectable effect the plan states, the project's own test (paired_difference and its p-value, fresh
    simulated studies on the default split at the measured components, the real pseudo-token grain) finds the
    difference in 75-85% of the studies (400 of them: one SE 0.02; the statement's own error about 0.013)."""
    p = planned(SPLIT, MEASURED, n_seeds, ALPHA, reps=600, seed=1)
    sim, rng = Simulator(SPLIT, MEASURED), np.random.default_rng(2)
    found = 0
    for _ in range(400):
        a = sim.cell(rng, "", n_seeds) - p["detectable"]
        d = paired_difference(a, sim.cell(rng, "", n_seeds), sim.family, 1 - 2 * ALPHA)
        found += d.p_value("<0") <= ALPHA
    assert 0.75 <= found / 400 <= 0.85, (p["detectable"], found / 400)


def test_the_coarse_draws_are_the_same_study():
    """Drawn with fewer pseudo-tokens (files scaled by q, the token noise law by q^-gamma), a study has the same
    unit shares and the same noise in each file mean."""
    coarse, comps = _coarse(SPLIT, MEASURED)
    q = sum(SPLIT.file_tokens) / sum(coarse.file_tokens)
    assert q > 2 and np.allclose(coarse.shares(), SPLIT.shares(), atol=2e-3)
    big = np.argmax(SPLIT.file_tokens)
    n, m = SPLIT.file_tokens[big], coarse.file_tokens[big]
    assert comps.kappa * m**-comps.gamma == pytest.approx(MEASURED.kappa * n**-MEASURED.gamma, rel=0.01)


def test_more_seeds_help_on_a_designed_split_not_on_one_a_family_dominates():
    """On the split before the family design the text part has one or two degrees of freedom (a family holds
    half the tokens): more seeds detect no smaller effect. On a designed split they do."""
    lay = designed()
    old = [planned(BEFORE, MEASURED, n, ALPHA, reps=300)["detectable"] for n in (3, 6)]
    better = [planned(lay, MEASURED, n, ALPHA, reps=300)["detectable"] for n in (3, 6)]
    assert old[1] > 0.8 * old[0]
    assert better[1] < 0.8 * better[0] < old[0]
    with pytest.raises(ValueError, match="at least 2 seeds"):
        planned(lay, MEASURED, 1, ALPHA)


def test_a_verdict_of_several_comparisons_needs_each_found_and_scales_with_its_se():
    from posenc_lab_analysis.stats import Difference

    units = np.repeat(np.arange(30), 50)
    d = Difference(-0.02, -0.04, 0.0, 0.95, 0.01, 8.0, 3, 3, 30, True)
    one = verdict_detectable([d], [False], units, 0.01)
    three = verdict_detectable([d, d, d], [False] * 3, units, 0.01)
    wider = verdict_detectable([Difference(-0.02, -0.08, 0.04, 0.95, 0.02, 8.0, 3, 3, 30, True)], [False], units, 0.01)
    assert three > one > 0.02 and wider == pytest.approx(2 * one)
    with pytest.raises(ValueError, match="alpha must be in"):
        verdict_detectable([d], [False], units, 0.7)


def test_the_plan_counts_the_verdicts_the_report_judges():
    """The plan's count of hypotheses comes from ``verdicts.judge`` on the planned grid: the default ablation has
    no half-loss absolute cells and no context-perturbation measure, so two verdicts are not judged; the controls
    (the recall probe's among them) never enter; a cell of one seed takes its verdicts out, as in the report."""
    config = paper()
    cells = {CellName(s, m): 3 for s in ("xl", "shaw", "sinusoid", "learned") for m in (0, 32)}
    cells |= {CellName("xl", m, group="recall"): 3 for m in (0, 16)} | {CellName("xl", 0, window=64): 3}
    main = lambda c: c.group == ""  # noqa: E731
    measures = {
        "as_trained": main,
        "attention_gain": lambda c: main(c) and c.memory,
        "position_gap": main,
        "context_gain": main,
        "recall_beyond": lambda c: c.group == "recall",
    }
    ids = judged(config, cells, measures)
    waiting = {"absolute_need_half_loss", "memory_uses_context_past_span"}  # no half-loss cells; no context_use
    assert not waiting & set(ids) and len(ids) == len(config["verdicts"]) - len(waiting)
    # the controls (the recall probe's among them) are never in Holm's family
    assert judged(config, cells, {k: f for k, f in measures.items() if k != "recall_beyond"}) == ids
    assert not {c["id"] for c in config["controls"]} & set(ids)
    assert "memory_beats_window_of_same_span" in ids
    assert "memory_beats_window_of_same_span" not in judged(
        config, {c: n for c, n in cells.items() if not c.window}, measures
    )
    one = judged(config, {**cells, CellName("xl", 0): 1}, measures)
    assert "memory_helps_xl" not in one and "memory_extends_xl_context" in one


def test_the_plan_states_what_each_seed_count_detects_and_a_dominant_family_costs_power():
    """`ablate --plan`'s lines (power.plan_lines): one per seed count, the detectable effect falling with seeds;
    on a split where one family holds most of the tokens the same study detects less; one seed is no verdict."""

    def layout(family_tokens):  # two files a family, of 1/3 and 2/3 of its scored tokens
        tokens = [round(n * share) for n in family_tokens for share in (1 / 3, 2 / 3)]
        return tokens, [g for g in range(len(family_tokens)) for _ in range(2)]

    def effects(family_tokens, seeds):
        lines = plan_lines(*layout(family_tokens), seeds, 7, 0.05, MEASURED)
        share = max(family_tokens) / sum(family_tokens)
        header = f"# power: {len(family_tokens)} families in the scored tokens (the largest {share:.1%}), 7 verdicts"
        assert lines[0].startswith(header) and "14 hypotheses" in lines[0], lines[0]
        return [float(x) for line in lines[1:] for x in re.findall(r"difference of (\d+\.\d+) nats", line)]

    even = [1000] * 40
    three, five = effects(even, [3, 5])
    assert three > five > 0
    (dominated,) = effects([40_000] + [1000] * 39, [5])
    assert dominated > 1.3 * five
    assert "no verdict is judged" in plan_lines(*layout(even), [1], 7, 0.05, MEASURED)[1]


@pytest.mark.parametrize("n_seeds,seed_sd", [(3, 0.0), (4, 0.05)])
def test_a_task_verdicts_stated_effect_is_found_with_its_power(n_seeds, seed_sd):
    """The task grid's statement (power.task_plan_lines): at the stated difference in exact match, fresh studies of
    the test as the lengthgen verdicts run it (two cells on the same 128 instances, each seed's accuracy off by
    N(0, seed_sd)) find it in about 80% of them (400 studies; one SE 0.02)."""
    level = 0.05 / 4
    delta = task_null_draws(128, n_seeds, level, seed_sd, reps=600, seed=1).detectable(level)
    rng, found = np.random.default_rng(2), 0
    for _ in range(400):
        acc = np.clip(
            0.5 + np.array([delta / 2, -delta / 2])[:, None, None] + rng.normal(0, seed_sd, (2, n_seeds, 1)), 0, 1
        )
        hits = (rng.random((2, n_seeds, 128)) < acc).astype(float)
        found += paired_difference(hits[0], hits[1], np.arange(128), 1 - 2 * level).p_value(">0") <= level
    assert 0.7 <= found / 400 <= 0.9, (delta, found / 400)  # 0/1 outcomes are not a pure shift: 73-80% found


def test_the_task_plan_states_each_seed_count_and_seed_spread_costs_power():
    lines = task_plan_lines(2, [1, 2, 3, 4], 128, 0.05, 0.05, "c.yaml")
    assert "2 claim(s)" in lines[0] and "one-sided alpha 0.013" in lines[0] and "seed SD of 0.05" in lines[0]
    assert "no task verdict is judged" in lines[1]
    # two seeds: the seed part of the interval has about 1 df, and no difference an accuracy can make is found
    assert "2 seeds a cell: detects no difference" in lines[2] and "a claim needs more seeds" in lines[2]
    three, four = (float(re.search(r"difference of ([\d.]+) in exact match", x).group(1)) for x in lines[3:])
    assert 0 < four < three < 1
    calm = float(re.search(r"difference of ([\d.]+)", task_plan_lines(2, [3], 128, 0.05, 0.0, "c.yaml")[1]).group(1))
    assert calm < three  # seeds that spread detect less
