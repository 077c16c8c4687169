"""The report's findings (analysis/ablation_table.py) on synthetic per-token losses: a planted
ordering is reproduced, pure noise is inconclusive, the reverse ordering is contradicted, a smoke
run judges nothing, and seeds make a cell's mean and spread."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from posenc_lab_analysis.ablation_table import ablation_table, cell_losses, findings, paper
from posenc_lab_analysis.effective_context import Dumps
from posenc_lab_analysis.runs import Run

ROWS, TOKENS, CONTEXTS = 8, 256, [16, 31, 32, 48, 64]
XL, SHAW = paper()["proposed"], paper()["prior_relative"]


def run(scheme: str, mem: int, seed: int = 0) -> Run:
    cfg = {
        "posenc": {"name": scheme},
        "model": {"mem_len": mem, "loss_recent_frac": 1.0},
        "data": {"name": "synthetic", "segment_len": 32},
        "seed": seed,
    }
    return Run(Path(f"/nowhere/{scheme}_mem{mem}_seed{seed}"), cfg, {"val": {"loss": 2.0}})


def grid(offsets: dict[tuple[str, int], float], noise: float = 0.3, seeds=(0,), seed_sd: float = 0.0, rng=None):
    """Runs and their dumps: a shared text difficulty plus each run's own noise plus its planted offset
    (nats); every run scored on the same tokens at every context length."""
    rng = rng or np.random.default_rng(0)
    text = 2.0 + rng.gamma(2.0, 0.5, size=(ROWS, TOKENS))
    runs, tokens = [], {}
    for (scheme, mem), off in offsets.items():
        for s in seeds:
            r = run(scheme, mem, s)
            runs.append(r)
            shift = off + rng.normal(0, seed_sd)
            tokens[r.name] = np.stack(
                [text + shift + noise * rng.standard_normal((ROWS, TOKENS)) for _ in CONTEXTS]
            ).astype(np.float32)
    dumps = Dumps(
        tokens,
        np.ones((ROWS, TOKENS), bool),
        CONTEXTS,
        [{"run": r.name, "scheme": r.scheme, "mem_len": r.mem_len, "loss": r.loss} for r in runs],
    )
    return runs, cell_losses(runs, dumps, block=16, n_boot=1000, level=0.95)


def verdict_of(lines: list[str], claim: str) -> str:
    line = next(x for x in lines if claim in x)
    return re.search(r"\*\*(.+?)\*\*", line).group(1)


def test_planted_ordering_is_reproduced():
    _, cl = grid({(XL, 32): 0.0, (XL, 0): 0.15, (SHAW, 32): 0.15, ("sinusoid", 32): 0.3})
    lines = findings(cl, "byte")
    assert verdict_of(lines, "XL encoding with recurrence is best") == "reproduced"
    assert verdict_of(lines, "XL beats Shaw") == "reproduced"
    assert verdict_of(lines, "Shaw's encoding beats the absolute") == "reproduced"
    assert verdict_of(lines, "recurrence helps the XL encoding") == "reproduced"


def test_noise_is_inconclusive_and_the_reverse_is_contradicted():
    _, cl = grid({(XL, 32): 0.0, (XL, 0): 0.0, (SHAW, 32): 0.0, ("sinusoid", 32): 0.0}, rng=np.random.default_rng(1))
    lines = findings(cl, "byte")
    for claim in ("XL beats Shaw", "recurrence helps the XL encoding", "Shaw's encoding beats the absolute"):
        assert verdict_of(lines, claim) == "inconclusive", lines
    _, cl = grid({(XL, 32): 0.15, (XL, 0): 0.0, (SHAW, 32): 0.0, ("sinusoid", 32): 0.3})
    lines = findings(cl, "byte")
    assert verdict_of(lines, "XL beats Shaw") == "contradicted"
    assert verdict_of(lines, "recurrence helps the XL encoding") == "contradicted"


def test_a_smoke_run_judges_nothing():
    _, cl = grid({(XL, 32): 0.0, (XL, 0): 0.15, (SHAW, 32): 0.15})
    lines = findings(cl, "byte", smoke=True)
    judged = [x for x in lines if x.startswith("Paper:")]
    assert judged and all("**not judged (smoke run)**" in x for x in judged)


def test_seeds_make_mean_and_spread_and_widen_the_interval():
    """Three seeds per cell, each shifted by a training effect (sd 0.05 nats): the table shows their
    mean and standard deviation; a difference of 0.03 nats between cells is not decided by one seed's
    tokens when the seeds disagree by more."""
    runs, cl = grid(
        {(XL, 32): 0.0, (SHAW, 32): 0.03}, noise=0.1, seeds=(0, 1, 2), seed_sd=0.05, rng=np.random.default_rng(3)
    )
    t, per_run = ablation_table(cl, "byte", None)
    assert list(t["eval_mode"]) == ["memory", "not trained"] * 2  # no run without memory: shown, not hidden
    t = t[t["seeds"] > 0]
    assert list(t["seeds"]) == [3, 3] and len(per_run) == 6
    for cell, g in per_run.groupby("cell"):
        row = t[t["cell"] == cell].iloc[0]
        assert row["init_bpb"] == pytest.approx(g["init_bpb"].mean())
        assert row["init_bpb_sd"] == pytest.approx(g["init_bpb"].std(ddof=1))
    xl, shaw = (cl.cells[c] for c in t["cell"])
    both = cl.boot.diff(cl.at(xl, 32), cl.at(shaw, 32), cl.counts)
    one = cl.boot.diff(cl.at(xl, 32)[:1], cl.at(shaw, 32)[:1], cl.counts)
    assert both.hi - both.lo > 2 * (one.hi - one.lo)


def test_the_report_says_smoke_and_how_many_seeds():
    from posenc_lab_analysis.report import ReportSettings, _preamble

    runs = [run(XL, 32, s) for s in (0, 1, 2)] + [run(SHAW, 32)]
    text = "\n".join(_preamble(runs, ReportSettings(smoke=True), "cpu", {}))
    assert "This is a smoke run" in text and "no finding below is judged" in text
    assert f"3 seeds: 1 cell ({XL}, mem 32, full loss); 1 seed: 1 cell" in text
    assert "smoke" not in "\n".join(_preamble(runs, ReportSettings(), "cpu", {}))
    assert ReportSettings.from_dict({"smoke": True, "bootstrap": {"block": 8}}).block == 8


def test_bad_bootstrap_settings_name_the_key():
    from posenc_lab_analysis.report import ReportSettings

    with pytest.raises(ValueError, match=r"ablate.analysis.bootstrap.block must be an integer >= 1.*got 0"):
        ReportSettings.from_dict({"bootstrap": {"block": 0}})
    with pytest.raises(ValueError, match=r"bootstrap.level must be in \(0, 1\).*got 95"):
        ReportSettings.from_dict({"bootstrap": {"level": 95}})
    with pytest.raises(ValueError, match=r"bootstrap.n_boot must be >= 100"):
        ReportSettings.from_dict({"bootstrap": {"n_boot": 10}})


def test_extrapolation_summary_is_one_row_per_cell():
    import pandas as pd

    from posenc_lab_analysis.extrapolation import per_cell

    runs = [run(XL, 32, 0), run(XL, 32, 1), run(SHAW, 32)]
    summary = pd.DataFrame(
        [
            {
                "run": r.name,
                "scheme": r.scheme,
                "recurrence": "on",
                "mem_len": 32,
                "loss": "full",
                "segment_at_1x": v,
                "horizon_past_delta": -v,
                "segment_na_from": na,
            }
            for r, v, na in zip(runs, [1.0, 2.0, 5.0], [64, None, None])
        ]
    )
    t = per_cell(summary, runs).set_index("scheme")
    assert t.loc[XL, "seeds"] == 2 and t.loc[XL, "segment_at_1x"] == 1.5 and t.loc[SHAW, "horizon_past_delta"] == -5


def test_recall_ordering_from_the_interval_of_a_difference():
    """Accuracy beyond one segment, with vs without memory: 60% vs 10% of 200 answers is reproduced,
    12% vs 10% is inconclusive; the Newcombe interval holds the difference."""
    import pandas as pd

    from posenc_lab_analysis.effective_context import _wilson, accuracy_difference, recall_findings

    def row(scheme, rec, acc, n=200):
        lo, hi = _wilson(acc * n, n, 0.95)
        return {
            "scheme": scheme,
            "recurrence": rec,
            "mem_len": 16 if rec == "on" else 0,
            "loss": "full",
            "acc_within_L": 0.9,
            "acc_beyond_L": acc,
            "beyond_lo": lo,
            "beyond_hi": hi,
            "chance": 0.0625,
        }

    t = pd.DataFrame([row(XL, "on", 0.6), row(XL, "off", 0.1), row(SHAW, "on", 0.12), row(SHAW, "off", 0.1)])
    iv = accuracy_difference(t.iloc[0], t.iloc[1])
    assert iv.lo < 0.5 < iv.hi and iv.lo > 0.3
    assert verdict_of(recall_findings(t.iloc[:2]), "with memory answers") == "reproduced"
    assert verdict_of(recall_findings(t), "with memory answers") == "inconclusive"
    assert verdict_of(recall_findings(t, smoke=True), "with memory answers") == "not judged (smoke run)"


@pytest.mark.parametrize(("gain", "expected"), [(0.15, "reproduced"), (0.0, "inconclusive"), (-0.15, "contradicted")])
def test_recurrence_as_trained_is_judged_from_paired_tokens(gain, expected):
    """The extrapolation section compares each scheme with and without memory as trained, on the same
    tokens: a planted gain of memory is reproduced, none is inconclusive, a loss is contradicted."""
    import pandas as pd

    from posenc_lab_analysis.extrapolation import ExtrapolationResult, _recurrence_as_trained

    rng = np.random.default_rng(1)
    text = 2.0 + rng.gamma(2.0, 0.5, size=(ROWS, TOKENS))
    on, off = run(XL, 32), run(XL, 0)
    tokens = {
        (r.name, "as_trained", 0): (
            text - shift + 0.3 * rng.standard_normal((ROWS, TOKENS)),
            np.ones((ROWS, TOKENS), bool),
        )
        for r, shift in ((on, gain), (off, 0.0))
    }
    res = ExtrapolationResult(pd.DataFrame(), pd.DataFrame(), tokens=tokens)
    lines = _recurrence_as_trained([on, off], res, (16, 1000, 0.95), 1.0, "nats", False, XL)
    assert len(lines) == 1
    assert verdict_of(lines, "recurrence helps the") == expected
    smoke = _recurrence_as_trained([on, off], res, (16, 1000, 0.95), 1.0, "nats", True, XL)
    assert verdict_of(smoke, "recurrence helps the") == "not judged (smoke run)"
