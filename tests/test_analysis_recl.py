"""RECL (analysis.effective_context.recl) on hand-made per-token losses with known answers."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from posenc_lab_analysis.effective_context import read_dumps, recl, recl_bootstrap, recl_text
from posenc_lab_analysis.runs import RunError

CONTEXTS = [100, 200, 300, 400, 500, 600]


def model_a(n_hard: int = 100, n_easy: int = 900) -> np.ndarray:
    """Hard tokens (loss 5) keep improving by 0.1 per step up to c = 500, easy ones (loss 1) up to 300."""
    hard_gain = {100: 0.4, 200: 0.3, 300: 0.2, 400: 0.1, 500: 0.0, 600: 0.0}
    easy_gain = {100: 0.2, 200: 0.1, 300: 0.0, 400: 0.0, 500: 0.0, 600: 0.0}
    return np.stack(
        [np.concatenate([np.full(n_hard, 5 + hard_gain[c]), np.full(n_easy, 1 + easy_gain[c])]) for c in CONTEXTS]
    )


def as_dict(table) -> dict:
    return {(row.model, row.r): row.recl for row in table.itertuples()}


def test_single_model_known_answer():
    """r = 1: the mean gains 0.1 nats per step until c = 300, then only the hard 10% gain 0.1 each
    (0.01 on the mean: gain 1 - e^-0.01 = 0.00995 < 0.01) -> RECL 300. r = 0.1 (hard tokens only):
    gains 1 - e^-0.1 until 500 -> 500. r = 0.5 (20% hard): mean gain 0.02 at 300 and 400 -> 500."""
    table, gains = recl({"A": model_a()}, CONTEXTS)
    assert as_dict(table) == {("A", 0.1): 500, ("A", 0.5): 500, ("A", 1.0): 300}
    assert not table["censored"].any()
    g = gains[(gains["r"] == 1.0) & (gains["c"] == 300)]["gain"].iloc[0]
    assert g == pytest.approx(1 - math.exp(-0.01), rel=1e-9)
    g = gains[(gains["r"] == 0.1) & (gains["c"] == 100)]["gain"].iloc[0]
    assert g == pytest.approx(1 - math.exp(-0.1), rel=1e-9)


def test_group_baseline_caps_a_worse_model():
    """B improves with context too, but stays worse than A everywhere: min(b(c,t), l_B(c')) is the
    baseline, so B gains nothing relative to the group and its RECL is the first c. A is unaffected."""
    a = model_a()
    b = a + 1.0  # same shape of improvement, always 1 nat worse
    table, _ = recl({"A": a, "B": b}, CONTEXTS)
    d = as_dict(table)
    assert d[("A", 0.1)] == 500 and d[("A", 1.0)] == 300
    assert all(d[("B", r)] == 100 for r in (0.1, 0.5, 1.0))


def test_never_converging_is_censored():
    losses = np.stack([np.full(50, 3.0 - 0.2 * k) for k in range(len(CONTEXTS))])
    table, _ = recl({"M": losses}, CONTEXTS)
    assert table["censored"].all()
    assert (table["recl"] == 500).all()  # the last c whose gain could be measured
    assert recl_text(500, True) == ">500"


def test_a_model_that_cannot_serve_longer_contexts_is_limited():
    a = model_a()
    short = a.copy()
    short[2:] = np.nan  # cannot serve c >= 300 (e.g. a learned table)
    table, gains = recl({"A": a, "S": short}, CONTEXTS)
    row = table[(table["model"] == "S") & (table["r"] == 0.1)].iloc[0]
    assert row["recl"] == 200 and row["limited"] and not row["censored"]
    assert recl_text(row["recl"], row["censored"], row["limited"]) == "200 (limit)"
    # A's baseline ignores S where S has no losses
    assert as_dict(table)[("A", 0.1)] == 500


LONG = list(range(100, 1100, 100))


def plateau(n: int = 50000) -> np.ndarray:
    """[len(LONG), n]: the hardest 10% (loss 5) gain 0.1 nats per step up to c = 400, the rest
    (loss 1) 0.05 up to 200, then nothing: RECL 400 at r = 0.1, 200 at r = 1."""
    k = np.arange(len(LONG))[:, None]
    hard = 5 - 0.1 * np.minimum(k, 3)
    easy = 1 - 0.05 * np.minimum(k, 1)
    n_hard = n // 10
    return np.concatenate(
        [np.broadcast_to(hard, (len(LONG), n_hard)), np.broadcast_to(easy, (len(LONG), n - n_hard))], axis=1
    )


def test_noise_gives_no_recl_gain():
    """Pure noise added to one model's losses (independent per token and context) must not buy it
    context: the paper's token-wise min against the baseline credits every dip of the noise (its
    RECL runs off the grid), the guarded RECL requires the model's own loss to fall and equals the
    clean model's. The case is flagged (noise_credited)."""
    rng = np.random.default_rng(0)
    a = plateau()
    noisy = a + rng.normal(0, 0.2, size=a.shape)
    table, gains = recl({"A": a, "N": noisy}, LONG)
    d = as_dict(table)
    assert d[("A", 0.1)] == 400 and d[("A", 1.0)] == 200
    for r in (0.1, 0.5, 1.0):
        assert d[("N", r)] == d[("A", r)], (r, d)
    n = table[table["model"] == "N"]
    assert (n["recl_paper"] == 900).all() and n["censored"].eq(False).all() and n["noise_credited"].all()
    assert (gains[gains["model"] == "N"]["gain"] > 0.01).all()  # the paper's gain never drops below 1%


def test_a_far_model_whose_loss_rises_gets_no_context():
    """shared/MEASURED.md: a model 0.8 bits worse than the group, its mean loss rising with context,
    got RECL 240 from the min against the baseline. Guarded: the first c, and flagged."""
    rng = np.random.default_rng(1)
    a = plateau(20000)
    far = a[:1] + 0.8 * math.log(2) + 0.02 * np.arange(len(LONG))[:, None] + rng.normal(0, 0.6, size=a.shape)
    table, _ = recl({"A": a, "F": far}, LONG)
    f = table[table["model"] == "F"]
    assert (f["recl"] == 100).all() and f["noise_credited"].all() and (f["recl_paper"] > 100).all()


def test_recl_bootstrap_interval():
    """A model whose gains stop sharply: every replicate finds the same RECL. Noisy seeds: an
    interval that holds the point estimate. Blocks of 10 tokens; the seeds of a cell are resampled."""
    rng = np.random.default_rng(2)
    a = plateau(2000)
    blocks = np.arange(a.shape[1]) // 10
    iv = recl_bootstrap({"A": a}, LONG, blocks, n_boot=50)
    hard = iv[iv["r"] == 0.1].iloc[0]
    assert hard["recl_lo"] == hard["recl_hi"] == 400
    point = iv["r"].map({0.1: 400, 0.5: 400, 1.0: 200})
    assert ((iv["recl_lo"] <= point) & (point <= iv["recl_hi"])).all()
    seeds = np.stack([a + rng.normal(0, 0.5, size=a.shape) for _ in range(3)])
    iv = recl_bootstrap({"A": seeds.mean(0)}, LONG, blocks, n_boot=100, seeds={"A": seeds})
    point = as_dict(recl({"A": seeds.mean(0)}, LONG)[0])
    for row in iv.itertuples():
        assert row.recl_lo <= point[("A", row.r)] <= row.recl_hi
    assert (iv["recl_hi"] > iv["recl_lo"]).any()


def test_bad_inputs():
    with pytest.raises(ValueError, match="not evenly spaced"):
        recl({"A": np.zeros((3, 4))}, [1, 2, 4])
    with pytest.raises(ValueError, match=r"\[len\(contexts\)=6"):
        recl({"A": np.zeros((5, 4))}, CONTEXTS)
    with pytest.raises(ValueError, match="strictly increasing"):
        recl({"A": np.zeros((2, 4))}, [2, 1])
    partial = model_a()
    partial[1, :3] = np.nan
    with pytest.raises(ValueError, match="some tokens"):
        recl({"A": partial}, CONTEXTS)


def _dump(path, run: str, corpus: str, contexts=(8, 16, 24)):
    meta = {
        "run": run,
        "scheme": "s",
        "mem_len": 8,
        "loss": "full",
        "corpus": corpus,
        "split": "valid",
        "n_rows": 2,
        "n_score": 5,
        "score_start": max(contexts),
        "contexts": list(contexts),
        "mode": "memory",
    }
    np.savez(
        path,
        loss=np.ones((len(contexts), 2, 5), np.float32),
        mask=np.ones((2, 5), bool),
        contexts=np.array(contexts),
        meta=json.dumps(meta),
    )
    return path


def test_dumps_of_different_corpora_are_refused(tmp_path):
    a = _dump(tmp_path / "a.npz", "a", "pystdlib")
    b = _dump(tmp_path / "b.npz", "b", "recall")
    d = read_dumps([a])
    assert d.contexts == [8, 16, 24] and d.losses["a"].shape == (3, 10) and d.tokens["a"].shape == (3, 2, 5)
    assert d.blocks(2).tolist() == [0, 0, 1, 1, 2, 3, 3, 4, 4, 5]  # 3 blocks per row of 5
    with pytest.raises(RunError, match="mix corpora"):
        read_dumps([a, b])
    c = _dump(tmp_path / "c.npz", "c", "pystdlib", contexts=(8, 16))
    with pytest.raises(RunError, match="context grid"):
        read_dumps([a, c])
    with pytest.raises(RunError, match="no such file"):
        read_dumps([tmp_path / "missing.npz"])
