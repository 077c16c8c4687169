"""The context-use section end to end on two tiny trained runs (a few dozen steps on 200 kB of the standard
library): the report prints use(d), the context used and the long-range tokens, and the numbers are what the
models can see, exactly: without memory a segment sees nothing before it (use(d) = 0 at every d); with memory
M and 2 layers nothing beyond 2 M, and the memory's text changes the loss."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from posenc_lab.train import train
from posenc_lab_analysis.perturbation import read_perturbed
from posenc_lab_analysis.report import ReportSettings, build_report
from posenc_lab_analysis.runs import find_runs
from tests.analysis.test_report import assert_cell_equals, md_tables
from tests.helpers_train import compose_config, tiny

L, M = 16, 16


@pytest.fixture(scope="module")
def runs(tmp_path_factory, cache):
    root = tmp_path_factory.mktemp("context_use")
    for name, mem in (("mem", M), ("nomem", 0)):
        overrides = tiny(root / name, cache, f"model.mem_len={mem}", "posenc=xl", steps=30, data="pystdlib")
        train(compose_config("train", overrides))
    return root


def settings(n_rows: int = 6) -> ReportSettings:
    s = ReportSettings.defaults()
    s.shared.sections = ["data", "context_use"]
    s.blocks["context_use"].n_rows = n_rows
    return s


@pytest.mark.slow  # two 30-step trainings and their perturbed evaluations: about a minute on 2 shared cores
def test_the_section_prints_use_context_used_and_long_range_tokens(runs, tmp_path):
    found = find_runs([runs])
    text = build_report(found, tmp_path, settings(), log=lambda _: None).read_text()
    assert "## 1. Context used: the loss when the far context is replaced" in text
    assert re.search(r"Long-range tokens: .* \d+ of [\d,]+ scored tokens", text)
    tables = md_tables(text)
    assert "lzma preset 9 (xz)" in set(tables["table_compressors"]["method"])  # the data section's compressors
    table = tables["table_context_use"]
    csv = pd.read_csv(tmp_path / "table_context_use.csv", keep_default_na=False, na_values=[""])
    for i in range(len(table)):
        for col in table.columns:
            assert_cell_equals(table.at[i, col], csv.at[i, col], f"table_context_use[{i}].{col}")
    assert (tmp_path / "context_use.png").stat().st_size > 5000

    nomem = next(r for r in found if r.mem_len == 0)
    mem = next(r for r in found if r.mem_len == M)
    dumps = {r.name: read_perturbed(tmp_path / "dumps" / "perturbed" / f"{r.name}.npz") for r in (nomem, mem)}
    d = dumps[nomem.name]
    assert np.array_equal(d.perturbed, np.broadcast_to(d.true, d.perturbed.shape))  # sees nothing before its segment
    d = dumps[mem.name]
    changed = {k: not np.array_equal(p, d.true) for k, p in zip(d.distances, d.perturbed)}
    assert not any(v for k, v in changed.items() if k >= 2 * M)  # 2 layers reach 2 M back, no further
    assert changed[0] and any(v for k, v in changed.items() if M <= k < 2 * M)  # the second layer's memory
    assert csv.set_index("cell").loc[nomem.cell, "context_used"] == "none"
