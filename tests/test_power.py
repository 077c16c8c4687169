"""The power statement (posenc_lab_analysis.power): the effect a verdict detects with 80% power, from the seeds
and units it had or planned from measured components."""

from __future__ import annotations

import re

import numpy as np
import pytest
from scipy import stats

from posenc_lab_analysis.coverage import BEFORE, designed
from posenc_lab_analysis.power import detectable, planned, verdict_detectable
from posenc_lab_analysis.stats import Difference


@pytest.mark.parametrize("df", [3.0, 10.0, 60.0])
def test_the_detectable_effect_is_found_with_about_its_power(df):
    """The power of a one-sided t test at the detectable effect is 0.8: exactly (noncentral t), and by simulating
    the t statistic."""
    se, alpha = 0.01, 0.05 / 14
    delta = detectable(se, df, alpha)
    exact = stats.nct.sf(stats.t.ppf(1 - alpha, df), df, delta / se)
    rng = np.random.default_rng(int(df))
    t = (delta + se * rng.standard_normal(20000)) / (se * np.sqrt(rng.chisquare(df, 20000) / df))
    assert exact == pytest.approx(0.8, abs=1e-6) and np.mean(t > stats.t.ppf(1 - alpha, df)) == pytest.approx(
        0.8, abs=0.015
    )


def test_a_verdict_of_several_comparisons_needs_each_found():
    d = Difference(-0.02, -0.04, 0.0, 0.95, 0.01, 8.0, 3, 3, 30, True)
    one, three = verdict_detectable([d], 0.01), verdict_detectable([d, d, d], 0.01)
    assert three > one == pytest.approx(detectable(0.01, 8.0, 0.01))
    with pytest.raises(ValueError, match="alpha must be in"):
        detectable(0.01, 8.0, 0.7)


def test_more_seeds_help_on_a_designed_split_not_on_one_a_family_dominates():
    """On the split before the family design the text part has one or two degrees of freedom (a family holds
    half the tokens): more seeds shrink the standard error but not the degrees of freedom of the text, and detect
    no smaller effect. On a designed split they do, and 3 seeds there detect less than 3 on the old one."""
    kw = dict(seed_sd_of_means=0.02, file_sd=0.05, icc=0.5, alpha=0.05 / 14)
    lay = designed()
    old = [planned(file_tokens=BEFORE.file_tokens, file_family=BEFORE.file_family, n_seeds=n, **kw) for n in (3, 6)]
    better = [planned(file_tokens=lay.file_tokens, file_family=lay.file_family, n_seeds=n, **kw) for n in (3, 6)]
    assert old[1]["se"] < old[0]["se"] and old[1]["detectable"] >= old[0]["detectable"]
    assert better[1]["detectable"] < better[0]["detectable"] < old[0]["detectable"]
    with pytest.raises(ValueError, match="at least 2 seeds"):
        planned(file_tokens=lay.file_tokens, file_family=lay.file_family, n_seeds=1, **kw)


def test_the_plan_states_what_each_seed_count_detects_and_a_dominant_family_costs_power():
    """`ablate --plan`'s lines (power.plan_lines): one per seed count, the detectable effect falling with seeds;
    on a split where one family holds most of the tokens the same study detects less; one seed is no verdict."""
    from posenc_lab_analysis.coverage import MEASURED
    from posenc_lab_analysis.power import plan_lines

    def layout(family_tokens):  # two files a family, of 1/3 and 2/3 of its scored tokens
        tokens = [round(n * share) for n in family_tokens for share in (1 / 3, 2 / 3)]
        return tokens, [g for g in range(len(family_tokens)) for _ in range(2)]

    def effects(family_tokens, seeds):
        lines = plan_lines(*layout(family_tokens), seeds, 7, 0.05, MEASURED)
        share = max(family_tokens) / sum(family_tokens)
        header = f"# power: {len(family_tokens)} families in the scored tokens (the largest {share:.1%})"
        assert lines[0].startswith(header), lines[0]
        return [float(x) for line in lines[1:] for x in re.findall(r"difference of (\d+\.\d+) nats", line)]

    even = [1000] * 40
    three, five, eight = effects(even, [3, 5, 8])
    assert three > five > eight > 0
    (dominated,) = effects([40_000] + [1000] * 39, [5])
    assert dominated > 1.3 * five
    assert "no verdict is judged" in plan_lines(*layout(even), [1], 7, 0.05, MEASURED)[1]
