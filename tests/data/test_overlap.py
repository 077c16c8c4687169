"""Verbatim overlap between splits (posenc_lab/data/overlap.py) against a brute
force search."""

import numpy as np


def test_shared_context_matches_a_brute_force_search():
    from posenc_lab.data.overlap import shared_context

    rng = np.random.default_rng(0)
    train = rng.integers(0, 4, 3000).astype(np.uint8)
    scored = np.concatenate([train[100:400], rng.integers(0, 4, 300).astype(np.uint8)])
    got = shared_context(train, scored, window=6)
    seen = {bytes(train[i : i + 6]) for i in range(len(train) - 5)}
    want = [t >= 6 and bytes(scored[t - 6 : t]) in seen for t in range(len(scored))]
    assert got.tolist() == want and got[6:300].all()
