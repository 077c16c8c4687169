"""STRING in the extrapolation analysis: a rope checkpoint evaluated along both window axes with and without it, on
the same tokens (every length here has distances past S, so every one differs; a span within S scores as plain
rope: tests/positional/test_rope_string.py); the model left as it was; the section's summary states the change
with its interval. Another scheme gets no STRING rows."""

from __future__ import annotations

import pandas as pd
import pytest

from posenc_lab.train import train
from posenc_lab_analysis import extrapolation
from posenc_lab_analysis.runs import cells, load_run
from posenc_lab_analysis.sections.extrapolation import summary
from tests.helpers_train import compose_config, tiny
from tests.schemes import ROPE, XL


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("string")
    runs = {}
    for scheme in (ROPE, XL):
        overrides = tiny(root / scheme, root / "cache", f"posenc={scheme}", steps=3, data="pystdlib")
        train(compose_config("train", overrides))
        runs[scheme] = load_run(root / scheme)
    return runs


def test_one_checkpoint_with_and_without_string_on_the_same_tokens(trained, tmp_path):
    rope, xl = trained[ROPE], trained[XL]
    span = rope.segment_len + rope.mem_len  # 32: S = round(0.25 * 32) = 8, W = 2
    settings = extrapolation.ExtrapolationSettings(
        n_rows=2, segment_factors=[1, 2], memory_factors=[1, 2], memory_score=None, horizon_factor=2,
        horizon_tokens=64, horizon_bins=4, string_shift_frac=0.25, string_window=2,
    )  # fmt: skip
    res = extrapolation.analyze([rope, xl], tmp_path, settings, "test")
    table = pd.read_csv(tmp_path / "extrapolation.csv")
    assert set(table[table["run"] == xl.name]["axis"]) == {"segment", "memory", "horizon"}
    on = table[(table["run"] == rope.name) & table["axis"].str.endswith("+string")]
    assert set(on["axis"]) == {"segment+string", "memory+string"} and (on["string_shift"] == round(0.25 * span)).all()
    assert (on["string_window"] == 2).all() and rope.model().scheme.string_shift is None  # restored
    for axis in ("segment", "memory"):
        for length in sorted(set(on[on["axis"] == f"{axis}+string"]["length"])):
            with_string, _ = res.tokens[(rope.name, f"{axis}+string", length)]
            without, _ = res.tokens[(rope.name, axis, length)]
            assert with_string.shape == without.shape and (abs(with_string - without).max() > 1e-4), (axis, length)
    row = summary(res, cells([rope]), 1.0, 0.9).iloc[0]
    assert row["string_memory_change"].count("[") == 1 and row["string_segment_change"].count("[") == 1
