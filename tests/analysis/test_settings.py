"""Every analysis default has one owner, the ``ablate.analysis`` block of conf/ablate.yaml: the code declares each
block's keys and types (a dataclass per block, checked by OmegaConf), never a value, and the commands that run
one analysis alone take their defaults from the same file."""

from __future__ import annotations

from dataclasses import MISSING, fields

import pandas as pd

from posenc_lab_analysis import settings
from posenc_lab_analysis.dumps import AsTrained, ContextSettings
from posenc_lab_analysis.report import ReportSettings, Shared
from posenc_lab_analysis.sections import SECTIONS


def test_conf_states_every_key_the_code_declares_and_the_code_no_value():
    block = settings.conf_block()
    own = {n for n, cls in SECTIONS.items() if cls.Settings is not None}
    assert set(block) == {f.name for f in fields(Shared)} | own  # no key the code does not read, none missing
    declared = {"trained": AsTrained, "context": ContextSettings, **{n: SECTIONS[n].Settings for n in own}}
    for key, kind in declared.items():
        assert set(block[key]) == {f.name for f in fields(kind)}, key
    for kind in (Shared, *declared.values()):
        assert all(f.default is MISSING and f.default_factory is MISSING for f in fields(kind)), kind
    assert set(block["sections"]) == set(SECTIONS)  # every registered section has its place in the report
    s = ReportSettings.defaults()
    assert s.shared.context.n_boot == block["context"]["n_boot"] and s.blocks["speed"].reps == block["speed"]["reps"]


def test_the_scripts_take_their_defaults_from_conf(tiny_ablation, tmp_path, monkeypatch, capsys):
    """conf/ablate.yaml changed (here in memory): `python -m posenc_lab_analysis.extrapolation` and `posenc-lab
    compare`, given no option, follow it."""
    from posenc_lab_analysis import compare, extrapolation

    conf = settings.conf_block()
    conf["extrapolation"].update(n_rows=2, segment_factors=[1, 2], memory_factors=[1], horizon_factor=2)
    conf["trained"].update(n_streams=4, n_tokens=64)
    monkeypatch.setattr(settings, "_conf_analysis", lambda: conf)
    runs = tiny_ablation / "runs"
    assert extrapolation.main([str(runs / "xl_mem16_full_seed0"), "--out", str(tmp_path / "ext")]) == 0
    ext = pd.read_csv(tmp_path / "ext" / "extrapolation.csv")
    assert sorted(ext[ext["axis"] == "segment"]["factor"]) == [1.0, 2.0]
    assert list(ext[ext["axis"] == "memory"]["factor"]) == [1.0]
    capsys.readouterr()
    assert compare.main([str(runs / "xl_mem16_full_seed0"), str(runs / "xl_mem0_full_seed0")]) == 0
    assert " 256 tokens;" in capsys.readouterr().out  # 4 streams x 64 tokens
