"""Every ablation preset composes from the real conf/ groups: the ablate config, its grid, and every
run's `posenc-lab train` config (including the GPU preset that cannot run here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis import ablate
from analysis.report import ReportSettings
from posenc_lab.model import ModelConfig
from posenc_lab.positional import SCHEMES, build_scheme, schemes_of_kind
from posenc_lab.train import model_config

CONF = Path(ablate.CONF_DIR)
PRESETS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml") if "\nablate:" in p.read_text())


def test_the_presets_the_issue_names_exist():
    assert {"tiny", "quick", "ablation", "wt103_table6"} <= set(PRESETS)


def representative(specs):
    """An absolute scheme with memory, a relative one without, a half-loss run and a recall run: the distinct
    code paths."""
    picks = [s for s in specs if SCHEMES[s.scheme].kind == "absolute" and s.mem_len][:1]
    picks += [s for s in specs if SCHEMES[s.scheme].kind == "relative" and not s.mem_len][:1]
    picks += [s for s in specs if s.loss_frac != 1.0][:1]
    picks += [s for s in specs if s.group == "recall"][:1]
    return picks


@pytest.mark.parametrize("every_run", [False, pytest.param(True, marks=pytest.mark.slow)])
@pytest.mark.parametrize("preset", PRESETS)
def test_preset_composes_into_runs(preset, every_run, tmp_path):
    cfg = ablate.compose("ablate", [f"experiment={preset}", f"ablate.out={tmp_path}"])
    specs = ablate.plan(cfg, [f"experiment={preset}"])
    main = [s for s in specs if s.group == "main"]
    schemes = {s.scheme for s in main}  # the issue's five: every absolute scheme, at least two relative ones
    assert schemes >= set(schemes_of_kind("absolute")) and len(schemes & set(schemes_of_kind("relative"))) >= 2
    assert {s.mem_len > 0 for s in main} == {True, False}  # with and without memory
    ReportSettings.from_dict(dict(cfg.ablate.analysis))  # the analysis block is valid
    for spec in specs if every_run else representative(specs):
        run = ablate.compose("train", [*spec.overrides, f"run_dir={tmp_path / spec.name}"])
        assert run.posenc.name == spec.scheme and run.model.mem_len == spec.mem_len
        assert run.model.loss_recent_frac == spec.loss_frac
        # the run's scheme is built with its options sized to the run, and serves the training lengths
        cutoffs = run.model.get("adaptive_cutoffs")  # wt103_table6: WikiText-103's 267,735 words
        mc = ModelConfig(**model_config(run, vocab_size=267_735 if cutoffs else 256))
        build_scheme(mc.posenc, mc.dims, **mc.posenc_kwargs).validate(run.data.segment_len, mc.mem_len,
                                                                      run.data.episode_len or 0)


def test_default_preset_is_ablation():
    cfg = ablate.compose("ablate", [])
    assert cfg.ablate.name == "ablation" and cfg.data.name == "pystdlib"


def test_unknown_override_is_an_error(capsys):
    assert ablate.main(["experiment=quick", "ablate.no_such_key=1", "--plan"]) == 2
    assert "no_such_key" in capsys.readouterr().err
