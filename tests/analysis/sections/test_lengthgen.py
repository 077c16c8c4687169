"""The length-generalization analysis and section (analysis/lengthgen.py, analysis/sections/lengthgen.py) and the
task grid of ``ablate.tasks`` (posenc_lab/ablate/plan.py): intervals from the project's estimator, verdicts judged
on paired instances with Holm, claims checked before any work, the grid's cells, and the tiny preset end to end."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from posenc_lab.ablate.plan import plan
from posenc_lab.compose import compose
from posenc_lab_analysis.lengthgen import CellLength, Claim, judge, tidy, widened
from posenc_lab_analysis.report import ReportSettings
from posenc_lab_analysis.sections.lengthgen import read_claims, summary
from posenc_lab_analysis.settings import conf_block
from posenc_lab_analysis.stats import mean_interval


def cell(name: str, exact: np.ndarray | None, factor: int = 2, reason: str = "", answer_len: int = 3) -> CellLength:
    """A cell of task copy at ``factor`` x 8 whose instances are exactly right where ``exact`` [seeds, k] says
    (an instance right: all its answer tokens; wrong: its first token only)."""
    correct = None
    if exact is not None:
        tokens = np.repeat(exact[:, :, None], answer_len, axis=2).copy()
        tokens[:, :, 1:] = True
        correct = tokens.reshape(exact.shape[0], -1)
    return CellLength(
        "copy", f"copy/{name}", name.split(":")[0], 0, 8 * factor, factor, exact, correct, answer_len, reason
    )


def hits(p: float, seeds: int = 2, k: int = 200, seed: int = 0, flips: float = 0.05) -> np.ndarray:
    """[seeds, k]: which instances a cell gets right, about a share p; the seeds agree but on a few (``flips``): an
    instance is easy or hard for every seed alike, as for trained models."""
    rng = np.random.default_rng(seed)
    shared = rng.random(k) < p
    return shared[None] ^ (rng.random((seeds, k)) < flips)


def test_intervals_are_the_estimators_over_seeds_and_instances():
    c = cell("nope:nomem", hits(0.6))
    seq, tok = c.sequence(0.9), c.token(0.9)
    expect = mean_interval(c.exact.astype(float), np.arange(200), level=0.9)
    assert (seq.estimate, seq.low, seq.high) == (expect.estimate, expect.low, expect.high) and seq.covers_seeds
    # per token: 2 of every 3 answer tokens are always right, so 2/3 + 1/3 of the exact rate; instances the units
    assert tok.estimate == pytest.approx(2 / 3 + c.exact.mean() / 3) and tok.units == 200
    assert tok.high - tok.low < seq.high - seq.low
    t = tidy([c, cell("learned:nomem", None, reason="a learned table of 32 positions")], 0.9)
    assert np.isnan(t.loc[1, "seq_acc"]) and t.loc[1, "not_served"].startswith("a learned table")


def test_verdicts_paired_on_instances_with_holm():
    claims = [
        Claim("up", "copy", "nope:nomem", "sinusoid:nomem", 2, "src", "c"),
        Claim("down", "copy", "sinusoid:nomem", "nope:nomem", 2, "src", "c"),
        Claim("tie", "copy", "alibi:nomem", "rope:nomem", 2, "src", "c"),
        Claim("missing", "copy", "learned:nomem", "rope:nomem", 2, "src", "c"),
        Claim("one_seed", "copy", "xl:nomem", "rope:nomem", 2, "src", "c"),
    ]
    base = hits(0.3, seed=1)
    measured = [
        cell("nope:nomem", base | hits(0.5, seed=2, flips=0)),
        cell("sinusoid:nomem", base),
        cell("alibi:nomem", hits(0.5, seed=3)),
        cell("rope:nomem", hits(0.5, seed=3) ^ (np.arange(200) == 7)),  # one instance apart
        cell("learned:nomem", None, reason="too long"),
        cell("xl:nomem", hits(0.9, seeds=1)),
    ]
    v = judge(claims, measured, 0.95, 0.05).set_index("claim")["verdict"].to_dict()
    assert v == {
        "up": "reproduced",
        "down": "contradicted",
        "tie": "inconclusive",
        "missing": "not judged",
        "one_seed": "not judged",
    }


def test_a_claims_interval_is_shown_at_the_level_holm_decided_it_at():
    """Two claims: the weaker one is significant alone (one-sided p < 0.05: its 90% interval above 0) but not after
    Holm over the four hypotheses; its interval is shown at the Holm step's level and holds 0, as its verdict says."""
    from posenc_lab_analysis.stats import paired_difference

    base = hits(0.4, seed=1)
    rng = np.random.default_rng(7)
    gain = base | (rng.random(base.shape) < 0.08)  # a few more instances right
    claims = [
        Claim("strong", "copy", "nope:nomem", "sinusoid:nomem", 2, "src", "c"),
        Claim("weak", "copy", "alibi:nomem", "rope:nomem", 2, "src", "c"),
    ]
    measured = [
        cell("nope:nomem", base | hits(0.5, seed=2, flips=0)),
        cell("sinusoid:nomem", base),
        cell("alibi:nomem", gain),
        cell("rope:nomem", base),
    ]
    plain = paired_difference(gain.astype(float), base.astype(float), np.arange(base.shape[1]), level=0.90)
    v = judge(claims, measured, 0.95, 0.05).set_index("claim")
    assert 0.05 / 3 < v.loc["weak", "p"] < 0.05 and plain.low > 0  # alone significant; not at Holm's 2nd step
    assert v.loc["weak", "verdict"] == "inconclusive"
    shown = v.loc["weak", "difference"]
    low = float(shown.split("[")[1].split(",")[0])
    assert low <= 0 and shown.endswith(" at 96.7%"), shown  # 1 - 2 (0.05 / 3)


def test_a_token_claim_is_judged_on_answer_tokens_with_instances_as_units():
    """Ruoss et al. score per answer token: two cells with the same exact match (the same instances wholly right)
    whose wrong instances miss 1 and 2 of their 3 tokens: the token claim is reproduced, the sequence one is not."""
    exact = hits(0.3, seed=1, flips=0)

    def missing(k: int) -> CellLength:
        tokens = np.repeat(exact[:, :, None], 3, axis=2).copy()
        tokens[:, :, k:] |= True  # a wrong instance misses its first k tokens
        return CellLength(
            "copy", "copy/a:nomem" if k == 1 else "copy/b:nomem", "a", 0, 32, 4, exact, tokens.reshape(2, -1), 3
        )

    both = [missing(1), missing(2)]
    claims = [Claim(m, "copy", "a:nomem", "b:nomem", 4, "src", "c", metric=m) for m in ("token", "sequence")]
    v = judge(claims, both, 0.95, 0.05).set_index("claim")
    assert v.loc["token", "verdict"] == "reproduced" and v.loc["token", "metric"] == "token"
    assert v.loc["sequence", "verdict"] != "reproduced"


def test_a_claim_whose_cells_did_not_learn_is_not_judged_and_eases_no_other():
    """The competence gate: a claim is judged only where both cells reached the gate's exact match in distribution
    (validation, n_train); the others say which cell did not learn and how far it got, and stay in Holm's family
    with p = 1, so that withholding one verdict never eases another's correction."""
    base = hits(0.3, seed=1)
    measured = [
        cell("nope:nomem", base | hits(0.5, seed=2, flips=0)),
        cell("sinusoid:nomem", base),
        cell("alibi:nomem", base | hits(0.3, seed=4, flips=0)),
        cell("rope:nomem", base),
    ]
    claims = [
        Claim("gated", "copy", "nope:nomem", "sinusoid:nomem", 2, "src", "c"),
        Claim("kept", "copy", "alibi:nomem", "rope:nomem", 2, "src", "c"),
    ]
    learned = {"copy/nope:nomem": 0.97, "copy/sinusoid:nomem": 0.05, "copy/alibi:nomem": 0.95, "copy/rope:nomem": 0.9}
    v = judge(claims, measured, 0.95, 0.05, learned, gate=0.9).set_index("claim")
    assert v.loc["gated", "verdict"] == "not judged" and v.loc["gated", "in_distribution"] == "0.970 / 0.050"
    assert v.loc["kept", "in_distribution"] == "0.950 / 0.900"
    assert (
        v.loc["gated", "note"]
        == "not judged: did not learn (sinusoid:nomem 0.05 exact match in distribution, below 0.9)"
    )
    alone = judge(claims[1:], measured, 0.95, 0.05).set_index("claim")
    assert v.loc["kept", "verdict"] == alone.loc["kept", "verdict"] == "reproduced"
    # the withheld claim stays in the family (p = 1 both ways): the kept one's correction is that of 4 hypotheses
    assert v.loc["kept", "p_holm"] == pytest.approx(min(1.0, 4 * v.loc["kept", "p"]))
    assert v.loc["kept", "p_holm"] == pytest.approx(2 * alone.loc["kept", "p_holm"])
    ungated = judge(claims, measured, 0.95, 0.05).set_index("claim")
    assert ungated.loc["gated", "verdict"] == "reproduced"  # the gate alone withheld it
    missing = judge(claims, measured, 0.95, 0.05, {}, gate=0.9).set_index("claim")  # not measured: not judged
    assert missing.loc["kept", "note"].startswith("not judged: did not learn (alibi:nomem nan")


def test_the_papers_estimands_weigh_every_length_alike_and_rank_the_cells():
    """Ruoss's average per answer token over the lengths past training (each length alike, though longer ones hold
    more answer tokens) and its best seed; Kazemnejad's exact match over the buckets, the rank in each task, the
    mean rank over the tasks."""
    from posenc_lab_analysis.lengthgen import estimands

    def measured(task, name, rates, seeds_apart=0.0):
        out = []
        for factor, (rate, answer) in zip((1, 2, 4), rates):
            k = 40
            tokens = np.zeros((2, k, answer), dtype=bool)
            right = int(round(rate * answer))
            tokens[:, :, :right] = True
            tokens[1, : int(seeds_apart * k), :] = True  # the second seed gets some instances wholly right
            exact = tokens.all(2)
            c = CellLength(
                task, f"{task}/{name}", name.split(":")[0], 0, 8 * factor, factor, exact, tokens.reshape(2, -1), answer
            )
            out.append(c)
        return out

    # copy: a at 1/2 of 4 tokens (2x) and 3/4 of 8 (4x): Ruoss 0.625 (pooled over tokens it would be 8/12 = 0.667)
    cells = measured("copy", "a:nomem", [(1.0, 2), (0.5, 4), (0.75, 8)], seeds_apart=0.5)
    cells += measured("copy", "b:nomem", [(1.0, 2), (1.0, 4), (1.0, 8)])
    cells += measured("reverse", "a:nomem", [(1.0, 2), (1.0, 4), (1.0, 8)])
    cells += measured("reverse", "b:nomem", [(1.0, 2), (0.0, 4), (0.0, 8)])
    per_cell, ranks = estimands(cells, 0.95)
    row = per_cell.set_index(["task", "cell"]).loc[("copy", "a:nomem")]
    first = 0.625
    second = (0.5 * (1 + 0.5) + 0.5 * (1 + 0.75)) / 2  # half its instances wholly right at each length
    assert row["ruoss"] == pytest.approx((first + second) / 2) and row["ruoss_best_seed"] == pytest.approx(second)
    assert row["ruoss_low"] <= row["ruoss"] <= row["ruoss_high"] and row["lengths"] == 2
    assert row["kazemnejad_exact"] == pytest.approx(0.25)  # the second seed's half, at both lengths
    assert per_cell.set_index(["task", "cell"])["rank_in_task"].to_dict() == {
        ("copy", "a:nomem"): 2.0,
        ("copy", "b:nomem"): 1.0,
        ("reverse", "a:nomem"): 1.0,
        ("reverse", "b:nomem"): 2.0,
    }
    assert ranks.set_index("cell")["mean_rank"].to_dict() == {"a:nomem": 1.5, "b:nomem": 1.5}
    assert set(ranks["tasks"]) == {2}


def test_a_claim_past_training_pairs_every_longer_length_each_alike():
    """factor: past (Ruoss et al.'s average): the difference of the instances' shares of right answer tokens over
    2x and 4x side by side (not 1x), paired on the instances; 4x's longer answers weigh no more than 2x's."""
    from posenc_lab_analysis.lengthgen import PAST
    from posenc_lab_analysis.stats import paired_difference

    def lengths(name, rates):
        out = []
        for factor, rate in zip((1, 2, 4), rates):
            answer = 4 * factor
            tokens = np.zeros((2, 50, answer), dtype=bool)
            tokens[:, :, : int(rate * answer)] = True
            tokens[1, :5] = True  # the seeds differ a little
            out.append(
                CellLength(
                    "reverse",
                    f"reverse/{name}",
                    name,
                    0,
                    8 * factor,
                    factor,
                    tokens.all(2),
                    tokens.reshape(2, -1),
                    answer,
                )
            )
        return out

    measured = lengths("a:nomem", [1.0, 0.5, 0.25]) + lengths("b:nomem", [1.0, 0.25, 0.25])
    claim = Claim("avg", "reverse", "a:nomem", "b:nomem", PAST, "src", "c", metric="token")
    v = judge([claim], measured, 0.95, 0.05).iloc[0]
    share = lambda c: c.correct.reshape(2, 50, c.answer_len).mean(2)  # noqa: E731
    a = np.concatenate([share(c) for c in measured[1:3]], axis=1)
    b = np.concatenate([share(c) for c in measured[4:6]], axis=1)
    want = paired_difference(a, b, np.arange(100), level=0.95)
    assert v["p"] == pytest.approx(want.p_value(">0")) and v["verdict"] != "not judged"
    # 2x alone differs (0.5 - 0.25), on every instance of seed 0 and 9 in 10 of seed 1; 4x's mean weighs as 2x's
    assert want.estimate == pytest.approx((0.25 + 0.9 * 0.25) / 2 / 2)
    missing = judge([claim], measured[:2] + measured[3:], 0.95, 0.05).iloc[0]  # a's 4x not there: not judged
    assert missing["verdict"] == "not judged"


def test_a_bad_competence_gate_is_one_line(tmp_path, monkeypatch):
    from posenc_lab_analysis.sections.lengthgen import read_gate

    assert read_gate("lengthgen_paper.yaml") == 0.9
    bad = tmp_path / "conf"
    bad.mkdir()
    (bad / "c.yaml").write_text("competence: 1.5\nclaims: []\n")
    monkeypatch.setattr("posenc_lab_analysis.sections.lengthgen.config_dir", lambda: str(bad))
    with pytest.raises(
        ValueError, match=r"^ablate.analysis.lengthgen.claims=c.yaml: competence must be in \(0, 1\] or null, got 1.5$"
    ):
        read_claims("c.yaml")


def test_claims_and_settings_are_checked_before_any_work(tmp_path, monkeypatch):
    claims, alpha = read_claims("lengthgen_paper.yaml")
    assert alpha == 0.05 and {c.task for c in claims} == {"copy", "addition", "reverse", "duplicate_string"}
    assert all(c.source for c in claims) and {c.factor for c in claims} <= {2, 4}
    block = conf_block()
    block["lengthgen"]["claims"] = "nothere.yaml"
    with pytest.raises(ValueError, match=r"^ablate.analysis.lengthgen.claims=nothere.yaml: no file .*nothere.yaml"):
        ReportSettings.read(block)
    block["lengthgen"].update(claims="lengthgen_paper.yaml", max_instances=0)
    with pytest.raises(ValueError, match=r"max_instances must be >= 1 \(or null: all\), got 0$"):
        ReportSettings.read(block)
    bad = tmp_path / "conf"
    bad.mkdir()
    (bad / "c.yaml").write_text(
        "claims:\n  - {id: x, task: sort, better: a, than: b, factor: 2, claim: c, source: s}\n"
    )
    monkeypatch.setattr("posenc_lab_analysis.sections.lengthgen.config_dir", lambda: str(bad))
    with pytest.raises(ValueError, match=r"claim x: task 'sort' is not a task; the tasks: \["):
        read_claims("c.yaml")
    (bad / "c.yaml").write_text(
        "claims:\n  - {id: x, task: copy, better: a, than: b, factor: 2, claim: c, source: s, metric: bits}\n"
    )
    with pytest.raises(ValueError, match=r"claim x: metric must be one of \['sequence', 'token'\], got 'bits'$"):
        read_claims("c.yaml")


def test_summary_gives_4x_with_intervals_and_where_a_scheme_stops():
    measured = [cell("nope:nomem", hits(0.5), factor=f) for f in (1, 2, 4, 8)]
    measured += [cell("learned:nomem", hits(0.5), factor=1)]
    measured += [cell("learned:nomem", None, factor=f, reason="table of 32") for f in (2, 4, 8)]
    s = summary(tidy(measured, 0.95)).set_index("cell")
    assert set(s.columns) >= {"seq_1x", "seq_2x", "seq_4x", "seq_8x", "seq_4x_interval", "token_4x_interval"}
    assert s.loc["copy/learned:nomem", "not_served"] == "from length 16: table of 32"
    assert s.loc["copy/nope:nomem", "not_served"] == "" and "[" in s.loc["copy/nope:nomem", "seq_4x_interval"]


def test_the_task_grid_of_the_preset():
    """The third attempt: the claims' four cells on reverse, no memory, five fresh seeds each, and the claims file
    names exactly those cells (every task a claim names is in the preset)."""
    cfg = compose("ablate", ["experiment=lengthgen"])
    specs = plan(cfg, ["experiment=lengthgen"])
    cells = {s.cell for s in specs}
    assert cells == {f"reverse/{c}:nomem" for c in ("nope", "sinusoid", "rope", "rope+rand256")}
    assert len(specs) == 4 * 5 and {s.seed for s in specs} == {100, 101, 102, 103, 104}
    claims, _ = read_claims(cfg.ablate.analysis.lengthgen.claims)
    assert {f"{c.task}/{x}" for c in claims for x in (c.better, c.than)} == cells
    rand = [s for s in specs if s.random_positions]
    assert {s.scheme for s in rand} == {"rope"} and all("+model.random_positions=256" in s.overrides for s in rand)
    assert all(f"data={s.group}" in s.overrides for s in specs) and len({s.name for s in specs}) == len(specs)
    run = compose("train", ["experiment=lengthgen", "data=reverse"])
    assert run.data.corpus.fresh and run.data.corpus.align_to_segment == run.data.segment_len == 24
    others = [
        "experiment=lengthgen",
        "ablate.tasks.names=[copy,addition,duplicate_string]",
        "ablate.extra_seed_cells=[]",
    ]
    assert {s.group for s in plan(compose("ablate", others), others)} == {"copy", "addition", "duplicate_string"}
    for override, message in (
        ("ablate.tasks.names=[copy,sort]", r"ablate.tasks.names names unknown task\(s\) \['sort'\]; the tasks: "),
        ("+ablate.tasks.random_positions.path=64", r"ablate.tasks.random_positions.path=64: it takes a scheme of"),
    ):
        with pytest.raises(ValueError, match=message):
            plan(compose("ablate", ["experiment=lengthgen", override]), ["experiment=lengthgen"])


@pytest.mark.slow
def test_the_tiny_preset_reports_every_cell_at_4x(tmp_path, monkeypatch):
    from posenc_lab import ablate

    monkeypatch.setenv("POSENC_LAB_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "lengthgen_tiny"
    assert ablate.main(["experiment=lengthgen_tiny", f"ablate.out={out}"]) == 0
    report = out / "report"
    text = (report / "report.md").read_text()
    assert "Length generalization" in text and "lengthgen_accuracy.png" in text
    t = pd.read_csv(report / "table_lengthgen.csv", keep_default_na=False)
    # 2 tasks x 10 cells, each at 4x with its interval, or with the reason it cannot serve 4x
    assert len(t) == 2 * 10 and ((t["seq_4x_interval"].str.contains(r"\[")) != (t["not_served"] != "")).all()
    full = pd.read_csv(report / "lengthgen" / "lengthgen_accuracy.csv", keep_default_na=False)
    assert sorted(set(full["factor"])) == [1, 2, 4, 8]
    served = full[full["not_served"] == ""]
    assert ((served["seq_low"] <= served["seq_acc"]) & (served["seq_acc"] <= served["seq_high"])).all()
    # without memory a whole instance is one window: random positions of 256 serve it; memory cells serve all
    assert (full.loc[full["memory"], "not_served"] == "").all()
    # a learned table of L = 16 positions serves the 1x window (10 tokens of copy), not the 2x one (18)
    learned = t.set_index("cell").loc["copy/learned:nomem"]
    assert learned["not_served"].startswith("from length 8: ") and learned["seq_2x"] == "" != learned["seq_1x"]
    assert t.set_index("cell").loc["copy/sinusoid:nomem", "not_served"] == ""


def test_accuracy_intervals_stay_within_0_and_1():
    """Two seeds that disagree give a t interval of about 1 df, far past 0 and 1 unclipped: an accuracy's interval
    is bounded to [0, 1], its estimate as it was."""
    high = cell("nope:nomem", np.array([[True] * 20, [True] * 10 + [False] * 10]))
    low = cell("rope:nomem", np.array([[False] * 20, [False] * 10 + [True] * 10]))
    for c in (high, low):
        for d in (c.sequence(0.95), c.token(0.95)):
            assert 0.0 <= d.low <= d.estimate <= d.high <= 1.0
    assert high.sequence(0.95).high == 1.0 and low.sequence(0.95).low == 0.0
    assert high.sequence(0.95).estimate == 0.75 and low.sequence(0.95).estimate == 0.25
    unclipped = mean_interval(high.exact.astype(float), np.arange(20), level=0.95)
    assert unclipped.low < 0.0 and unclipped.high > 1.0  # what the section gave before
    t = tidy([high, low], 0.95)
    assert t[["seq_low", "token_low"]].min().min() >= 0 and t[["seq_high", "token_high"]].max().max() <= 1


def test_an_aligned_instance_shorter_than_a_segment_is_read_in_a_segments_window():
    """Random positions are drawn for a window's keys: an instance of 18 tokens read alone would draw 17 positions
    where training drew 32. Pads go after it (causal: its predictions unchanged) and are never scored."""
    rows, scored = np.arange(36).reshape(2, 18), np.tile([False] * 9 + [True] * 8, (2, 1))
    ids = {"abacus": rows % 5 + 1}
    wide, wide_scored, wide_ids = widened(rows, scored, ids, 32, pad=99)
    assert wide.shape == (2, 33) and wide_scored.shape == (2, 32)
    assert np.array_equal(wide_ids["abacus"][:, :18], ids["abacus"]) and (wide_ids["abacus"][:, 18:] == 0).all()
    assert np.array_equal(wide[:, :18], rows) and (wide[:, 18:] == 99).all()
    assert np.array_equal(wide_scored[:, :17], scored) and not wide_scored[:, 17:].any()
    long, long_scored = np.zeros((2, 40), np.int64), np.zeros((2, 39), bool)
    assert widened(long, long_scored, {}, 32, pad=99)[0] is long  # longer than a segment: as it is


def test_the_figure_draws_an_interval_that_does_not_hold_its_mean(tmp_path):
    """A skewness-corrected interval can lie beside its mean (accuracy near 0 or 1 over few seeds): the figure
    draws it, with no negative bar (matplotlib refuses one), instead of ending the report."""
    from posenc_lab_analysis.sections.lengthgen import figure

    rows = [
        dict(task="reverse", scheme="rope", cell="reverse/rope:mem32", memory=True, factor=f,
             seq_acc=0.02, seq_low=0.03, seq_high=0.2, token_acc=0.6, token_low=0.4, token_high=0.55)
        for f in (1, 2, 4, 8)
    ]  # fmt: skip
    path = figure(pd.DataFrame(rows), tmp_path / "lengthgen_accuracy.png")
    assert path.exists() and path.stat().st_size > 1000


def test_a_memory_cell_reads_each_instance_after_the_one_before_it_as_training_streams_them():
    from posenc_lab_analysis.lengthgen import after_previous

    rows = np.array([[9, 1, 2, 7, 3, 9], [9, 4, 5, 7, 6, 9]])  # packed: the end token (9), then the instance
    scored = np.array([[0, 0, 0, 1, 0], [0, 0, 0, 1, 0]], dtype=bool)
    ids = {"abacus": np.array([[0, 1, 2, 0, 1, 0], [0, 1, 2, 0, 1, 0]])}
    joined, s, i = after_previous(rows, scored, ids, align=0, pad=99)
    assert joined.tolist() == [[9, 4, 5, 7, 6, 9, 1, 2, 7, 3, 9], [9, 1, 2, 7, 3, 9, 4, 5, 7, 6, 9]]
    assert s.shape == (2, 10) and np.flatnonzero(s[0]).tolist() == [8]  # the target 3 of this instance alone
    assert joined[0, 8 + 1] == 3 and i["abacus"][0].tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 0, 1, 0]
    aligned, s, i = after_previous(rows[:, 1:], scored[:, 1:], {k: a[:, 1:] for k, a in ids.items()}, align=4, pad=99)
    # aligned: the instance before it padded to a multiple of 4, so this one starts a segment
    assert aligned[0].tolist() == [4, 5, 7, 6, 9, 99, 99, 99, 1, 2, 7, 3, 9] and i["abacus"][0, 5:8].tolist() == [
        0,
        0,
        0,
    ]
    assert np.flatnonzero(s[0]).tolist() == [10] and aligned[0, 11] == 3


def test_the_figure_tells_random_positions_from_other_marks():
    """Squares mean random positions alone: a cell with the data's ids (nope+abacus) is a cell of its own colour,
    not drawn as nope with random positions, and two kinds of ids are two colours."""
    from posenc_lab_analysis.sections.lengthgen import line_style

    assert line_style("rope+rand256") == ("rope", "s")
    assert line_style("rope") == ("rope", "o")
    assert line_style("nope+abacus") == ("nope+abacus", "o")
    assert line_style("nope+abacus+rand64") == ("nope+abacus", "s")
    assert line_style("nope+abacus")[0] != line_style("nope+coupling")[0]
