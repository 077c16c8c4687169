"""The own-baseline effective context (posenc_lab_analysis.effective_context, the effective_context section): a
planted knee is read where it was planted with an interval that covers it, a curve still falling at the grid's end
is a lower bound, the verdict's measure ``context_gain`` is judged by the preregistered verdict, and the tiny
ablation's report shows the table and the figure with curves past L + M."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from posenc_lab_analysis.effective_context import analyze, effective, gain_tokens
from posenc_lab_analysis.verdicts import CONTRADICTED, INCONCLUSIVE, NOT_TESTED, REPRODUCED, Evidence, judge, paper
from tests.analysis.test_verdicts import key

KW = dict(fraction=0.01, level=0.95)  # Khandelwal et al.'s 1% and the intervals these tests read

# the default preset's grid: every 4 tokens to 2 L = 64, then doubling to 4 (L + M) = 256
GRID = [*range(8, 65, 4), 120, 128, 248, 256]
N_UNITS, UNIT_LEN = 40, 200
UNITS = np.repeat(np.arange(N_UNITS), UNIT_LEN)


def cell(rng, knee: int, seeds: int = 3, drop: float = 0.1, noise: float = 0.3) -> np.ndarray:
    """[seeds, n_c, tokens]: a loss that falls ``drop`` nats per 4 tokens of context up to ``knee``, then stays
    flat (above 2 nats: a step is 5% of it), with per-unit difficulty, a seed effect and per-token noise."""
    base = 2.5 + rng.normal(0, 0.2, N_UNITS)[UNITS]
    c = np.array(GRID, float)
    level = drop * (np.minimum(knee, c.max()) - np.minimum(c, knee)) / 4
    return np.stack(
        [
            base + level[:, None] + rng.normal(0, 0.01) + rng.normal(0, noise, (len(GRID), len(UNITS)))
            for _ in range(seeds)
        ]
    )


def test_a_planted_knee_is_the_effective_context_and_its_interval_covers_it():
    rng = np.random.default_rng(0)
    cells = {"short": cell(rng, 24), "long": cell(rng, 128), "flat": cell(rng, 8, seeds=2)}
    res = analyze(cells, GRID, UNITS, n_boot=100, **KW)
    t = res.cells.set_index("cell")
    for name, knee in (("short", 24), ("long", 128), ("flat", 8)):
        assert t.loc[name, "c_eff"] == knee, name
        assert t.loc[name, "low"] <= knee <= t.loc[name, "high"], name
        assert t.loc[name, "seeds"] == ", ".join([str(knee)] * len(cells[name])) and not t.loc[name, "censored"]
    est, lo, hi = res.difference("long", "short")
    assert est == 104 and lo <= 104 <= hi and lo > 0
    # the gap to the own best: clearly above 0 before the knee, its interval holding 0 from the knee on
    gap = res.curves[res.curves["cell"] == "long"].set_index("c")
    assert gap.loc[64, "low"] > 0.5 and gap.loc[128, "low"] <= 0 <= gap.loc[128, "high"]
    assert gap.loc[256, "low"] <= 0 <= gap.loc[256, "high"]


def test_the_interval_covers_a_knee_between_grid_points_at_the_next_one():
    """A knee at 60 (between 56 and 64 of the 4-token grid, where a step is 1%: within the fraction) and noise
    enough that some replicates read 56: the interval covers the value the grid can give, 60 or the one beside."""
    rng = np.random.default_rng(1)
    hits = 0
    for _ in range(10):
        res = analyze({"a": cell(rng, 60, drop=0.025), "b": cell(rng, 16)}, GRID, UNITS, n_boot=60, **KW)
        row = res.cells.set_index("cell").loc["a"]
        hits += row["low"] <= 60 <= row["high"] and 56 <= row["c_eff"] <= 64
    assert hits >= 9


def test_a_curve_still_falling_at_the_last_c_served_is_a_lower_bound_and_unserved_c_are_left_out():
    curve = np.array([[3.0, 2.0, 1.0, 0.5], [3.0, 1.0, 1.0, np.nan], [np.nan] * 4])
    c_eff, best_c, censored = effective(curve, [8, 16, 32, 64], 0.01)
    assert c_eff[0] == 64 and censored[0] and best_c[0] == 64
    assert c_eff[1] == 16 and censored[1] == False and best_c[1] == 16  # noqa: E712 (numpy bool)
    assert np.isnan(c_eff[2]) and not censored[2]
    rng = np.random.default_rng(2)
    x = cell(rng, 256, seeds=2)
    x[:, -2:] = np.nan  # a window the scheme cannot serve past 128
    t = analyze({"x": x, "y": cell(rng, 16)}, GRID, UNITS, n_boot=50, **KW).cells.set_index("cell")
    assert t.loc["x", "c_eff"] == 128 and t.loc["x", "censored"] and t.loc["x", "seeds"] == ">=128, >=128"


def test_bad_inputs_are_one_line_naming_the_value():
    x = np.zeros((1, len(GRID), len(UNITS)))
    with pytest.raises(ValueError, match="fraction must be in"):
        analyze({"a": x}, GRID, UNITS, fraction=1.0, n_boot=50, level=0.95)
    with pytest.raises(ValueError, match=r"cell a: losses must be \[n_seeds, len\(contexts\)=19"):
        analyze({"a": x[:, :3]}, GRID, UNITS, n_boot=50, **KW)
    y = x.copy()
    y[0, 2, 5] = np.nan
    with pytest.raises(ValueError, match="cell a seed 0 has NaN losses for some tokens at c = 16"):
        analyze({"a": y}, GRID, UNITS, n_boot=50, **KW)
    with pytest.raises(ValueError, match=r"c = 512 was not evaluated"):
        gain_tokens(x, GRID, 32, 512)


def _spec():
    return next(v for v in paper()["verdicts"] if v["id"] == "memory_extends_xl_context")


def curve(rng, shape: str, seeds: int = 3) -> np.ndarray:
    """[seeds, n_c, tokens] on the default grid (L = M = 32): "falls" keeps falling 0.004 nats per 8 tokens of
    context to the grid's end (past L + M = 64); "flat" falls to L + M and stays there; "degrades" falls to
    L + M, then rises 0.01 nats per 8 tokens (a model past its training attention length)."""
    base = 2.5 + rng.normal(0, 0.2, N_UNITS)[UNITS]
    c = np.array(GRID, float)
    falling = 0.004 * (256 - c) / 8
    level = {
        "falls": falling,
        "flat": 0.004 * (256 - np.minimum(c, 64)) / 8,
        "degrades": 0.004 * (256 - np.minimum(c, 64)) / 8 + 0.01 * np.maximum(c - 64, 0) / 8,
    }[shape]
    return np.stack(
        [
            base + level[:, None] + rng.normal(0, 0.005) + rng.normal(0, 0.3, (len(GRID), len(UNITS)))
            for _ in range(seeds)
        ]
    )


def memory_verdict(cells: dict[str, np.ndarray]):
    """The preregistered `memory_extends_xl_context` on the measure the section provides: each cell's loss at
    c = 2 (L + M) = 128 minus at c = L + M = 64, per seed."""
    gains = {c: gain_tokens(x, GRID, 64, 128) for c, x in cells.items()}
    evidence = Evidence(gains, {c: key(c) for c in cells}, UNITS)
    (verdict,), _ = judge({"alpha": 0.05, "verdicts": [_spec()]}, {"context_gain": evidence})
    return verdict


@pytest.mark.parametrize(
    ("memory", "window", "expected"),
    [
        ("falls", "degrades", REPRODUCED),  # the memory model's own loss falls past L + M
        ("flat", "degrades", INCONCLUSIVE),  # only the window degrades: what passed the earlier form, wrongly
        ("degrades", "degrades", CONTRADICTED),  # both degrade, memory no less: no use of far context
        ("flat", "falls", INCONCLUSIVE),  # the window's own curve does not enter
    ],
)
def test_the_recurrence_verdict_reads_the_memory_models_own_loss_past_L_plus_M(memory, window, expected):
    """`memory_extends_xl_context` (conf/paper.yaml) is the memory model's loss at 2 (L + M) minus at L + M, below
    zero: reproduced where the memory curve keeps falling past L + M; a memory curve that is flat past L + M is not
    reproduced however much a window model degrades (the case the difference of two degradations passed); one
    that rises is contradicted."""
    rng = np.random.default_rng(3)
    spec = _spec()
    assert spec["measure"] == "context_gain" and spec["compare"] == ["xl:mem"] and spec["predict"] == "<0"
    assert "why_this_form" in spec and "two degradations" in spec["why_this_form"]
    v = memory_verdict({"xl:mem": curve(rng, memory), "xl:nomem": curve(rng, window)})
    assert v.status == expected, (v.status, v.comparisons[0].difference)
    assert [c.text for c in v.comparisons] == ["xl:mem"]  # the memory cell alone: no window enters


def test_the_earlier_difference_of_degradations_would_have_passed_the_flat_memory_curve():
    """The case the verdict was rewritten for, kept as evidence: on the same curves (memory flat past L + M, the
    window degrading), the earlier form (xl:mem's change from L to 2 (L + M) minus xl:nomem's) reproduces."""
    rng = np.random.default_rng(3)
    cells = {"xl:mem": curve(rng, "flat"), "xl:nomem": curve(rng, "degrades")}
    gains = {c: gain_tokens(x, GRID, 32, 128) for c, x in cells.items()}
    earlier = {**_spec(), "compare": ["xl:mem - xl:nomem"]}
    (v,), _ = judge(
        {"alpha": 0.05, "verdicts": [earlier]}, {"context_gain": Evidence(gains, {c: key(c) for c in cells}, UNITS)}
    )
    assert v.status == REPRODUCED
    assert memory_verdict(cells).status != REPRODUCED


def test_the_perturbation_form_waits_for_its_measure_and_is_judged_on_it():
    """`memory_uses_context_past_span` is not tested (out of Holm's family) until a section provides the measure
    `context_use`; fed by `evidence.context_use` (perturbed minus true losses), it reproduces where replacing the
    far text raises the loss and not where it changes nothing; mismatched inputs are one line."""
    from posenc_lab_analysis.evidence import context_use

    spec = next(v for v in paper()["verdicts"] if v["id"] == "memory_uses_context_past_span")
    assert spec["measure"] == "context_use" and spec["predict"] == ">0" and spec["compare"] == ["xl:mem"]
    both = {"alpha": 0.05, "verdicts": [spec, _spec()]}
    rng = np.random.default_rng(4)
    x = curve(rng, "falls")
    gains = Evidence({"xl:mem": gain_tokens(x, GRID, 64, 128)}, {"xl:mem": key("xl:mem")}, UNITS)
    waiting, judged_alone = judge(both, {"context_gain": gains})[0]
    assert waiting.status == NOT_TESTED and np.isnan(waiting.p) and "no context_use" in waiting.note
    alone = judge({"alpha": 0.05, "verdicts": [_spec()]}, {"context_gain": gains})[0][0]
    assert judged_alone.p_adjusted == alone.p_adjusted  # the waiting verdict costs the family nothing
    true = x[:, GRID.index(64)]
    for lift, expected in ((0.05, REPRODUCED), (0.0, INCONCLUSIVE)):
        noise = rng.normal(0, 0.05, true.shape)
        perturbed = true + lift + noise - noise.mean(1, keepdims=True)  # each seed's mean use exactly `lift`
        use = context_use({"xl:mem": true}, {"xl:mem": perturbed}, {"xl:mem": key("xl:mem")}, UNITS)
        v = judge({"alpha": 0.05, "verdicts": [spec]}, {"context_use": use})[0][0]
        assert v.status == expected, (lift, v.status)
    with pytest.raises(
        ValueError, match=r"cell xl:mem: true and perturbed losses must both be \[n_seeds, tokens=8000\]"
    ):
        context_use({"xl:mem": true}, {"xl:mem": true[:, :5]}, {"xl:mem": key("xl:mem")}, UNITS)


def test_an_inconclusive_recurrence_verdict_says_what_its_design_could_detect():
    """Beside an inconclusive `memory_extends_xl_context`, the section states the measured difference and the
    effect the design detects at 80% power at the verdict's Holm level (power.verdict_detectable), and whether the
    difference is smaller than that; a judged (reproduced) verdict gets no such line."""
    from dataclasses import replace

    from posenc_lab_analysis.sections.effective_context import reach_lines
    from posenc_lab_analysis.sections.verdicts import detectable

    rng = np.random.default_rng(3)
    judged = {}
    for memory_knee in (32, 128):
        cells = {"xl:mem": cell(rng, memory_knee, drop=0.002), "xl:nomem": cell(rng, 32, drop=0.002)}
        gains = {c: gain_tokens(x, GRID, 64, 128) for c, x in cells.items()}  # from L + M to 2 (L + M)
        evidence = Evidence(gains, {c: key(c) for c in cells}, UNITS)
        (judged[memory_knee],), _ = judge({"alpha": 0.05, "verdicts": [_spec()]}, {"context_gain": evidence})
    flat, gaining = judged[32], judged[128]
    assert flat.status == INCONCLUSIVE and gaining.status == REPRODUCED
    power = detectable(flat, UNITS)
    assert reach_lines([gaining], 1.0, "nats", {gaining.id: detectable(gaining, UNITS)}) == []
    d = flat.comparisons[0].difference
    (line,) = reach_lines([flat], 2.0, "bits", {flat.id: power})
    assert f"detects {power * 2:.3g} with 80% power" in line and d.scaled(2.0).text(3) in line
    assert f"at its Holm level {flat.level:.1%}" in line
    assert f"{abs(d.estimate) / power:.0%} of that, smaller than the interval can reach" in line
    big = replace(flat, comparisons=[replace(flat.comparisons[0], difference=replace(d, estimate=2 * power))])
    (line,) = reach_lines([big], 1.0, "nats", {big.id: power})
    assert "200% of that, within reach" in line and "smaller" not in line


def test_the_tiny_ablation_report_shows_curves_past_L_plus_M(tiny_ablation):
    """experiment=tiny (L = M = 16): the table and the figure, every cell's curve reaching c = 4 (L + M) = 128 where
    its scheme serves it, and the learned table's window and global_sinusoid past its episodes named."""
    rep = tiny_ablation / "report"
    text = (rep / "report.md").read_text()
    assert re.search(r"^## \d+\. Effective context against each model's own best$", text, re.M)
    assert "(table_effective_context.csv)" in text and "](context_curves.png)" in text
    assert (rep / "context_curves.png").stat().st_size > 5000
    table = pd.read_csv(rep / "table_effective_context.csv").set_index("cell")
    assert {"xl:mem16", "xl:nomem", "learned:nomem"} <= set(table.index)
    assert table.loc["xl:nomem", "served"] == "every c to 128" and table.loc["xl:mem16", "context"] == "memory c"
    assert "max_positions" in table.loc["learned:nomem", "served"]
    assert "training episodes (T = 64)" in table.loc["global_sinusoid:nomem", "served"]
    curves = pd.read_csv(rep / "context_curves.csv")
    reach = curves.groupby("cell")["c"].max()
    everywhere = table["served"] == "every c to 128"
    assert everywhere.sum() >= 10 and (reach[everywhere[everywhere].index] == 128).all()
    assert reach["learned:nomem"] < 16 and reach["global_sinusoid:nomem"] == 56  # c + 1 = 57 positions < T = 64
    seeds = pd.read_csv(rep / "recl_seeds.csv")
    assert len(seeds) == 3 * 14 - 3 * 2 and set(seeds["r"]) == {0.1, 0.5, 1.0}  # 12 language runs, 3 r each
    verdicts = pd.read_csv(rep / "table_verdicts.csv").set_index("verdict")
    assert verdicts.loc["memory_extends_xl_context", "status"] == "not judged (smoke run)"


def test_the_attention_gain_verdict_keeps_reading_c_4L_on_the_longer_grid():
    """only_xl_gains_from_attention was fixed with the grid ending at 4 L; the grid now runs to 4 (L + M), and the
    measure still reads 4 L (a memory model past its training attention would otherwise be judged at 256)."""
    from types import SimpleNamespace

    from posenc_lab_analysis.dumps import TokenLosses
    from posenc_lab_analysis.evidence import attention_gain

    contexts = [*range(8, 65, 4), 120, 128, 248, 256]
    loss = np.arange(len(contexts), dtype=np.float32)[:, None, None] * np.ones((1, 2, 10), np.float32)
    shape = (2, 10)
    dump = TokenLosses(
        loss,
        loss > 0,
        np.zeros(shape, int),
        np.arange(20).reshape(shape) % 4,
        np.ones(shape, bool),
        np.full(shape, -1),
        contexts,
        {},
    )
    run = SimpleNamespace(name="r", recurrence=True, cell_name=key("xl:mem"), segment_len=32, train_attention_length=64)
    ev = attention_gain({"xl:mem": [run]}, {"r": dump})
    assert np.all(ev.cells["xl:mem"] == contexts.index(128) - contexts.index(64))


@pytest.mark.slow
def test_the_tiny_context_preset_judges_the_recurrence_verdict_alone(tmp_path):
    """experiment=context_tiny (the context preset at toy size): its sections only, windows to 2 (L + M) = 64 and
    memory curves to 4 (L + M) = 128, and one verdict in the table, the others named as left out."""
    from posenc_lab import ablate

    out = tmp_path / "context_tiny"
    assert ablate.main(["experiment=context_tiny", f"ablate.out={out}", "ablate.jobs=2"]) == 0
    rep = out / "report"
    text = (rep / "report.md").read_text()
    titles = re.findall(r"^## \d+\. (.+)$", text, re.M)
    assert titles == [  # data and files are unnumbered; no table6, extrapolation, attention, recall, reach, speed
        "Verdicts (preregistered, test split, Holm-corrected)",
        "Loss by position in the segment",
        "Effective context against each model's own best",
        "Relative effective context length (RECL)",
    ], titles
    assert "Left out, not judged here: `memory_helps_xl`" in text
    verdicts = pd.read_csv(rep / "table_verdicts.csv")  # the claims alone (controls: table_controls.csv)
    assert list(verdicts["verdict"]) == ["memory_beats_window_of_same_span", "memory_extends_xl_context"]
    table = pd.read_csv(rep / "table_effective_context.csv").set_index("cell")
    assert set(table.index) == {"xl:mem16", "xl:nomem", "xl:win32", "shaw:mem16", "sinusoid:mem16"}
    assert "window_max" in table.loc["xl:nomem", "served"] and table.loc["xl:mem16", "served"] == "every c to 128"
    reach = pd.read_csv(rep / "context_curves.csv").groupby("cell")["c"].max()
    assert reach["xl:nomem"] == 64 and reach["xl:mem16"] == 128
