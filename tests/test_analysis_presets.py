"""Every ablation preset composes from the real conf/ groups: the ablate config, its grid, and every
run's `posenc-lab train` config (including the GPU preset that cannot run here)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from posenc_lab.build import build_datamodule, model_config
from posenc_lab.data import check_corpus_options, load_corpus
from posenc_lab.model import ModelConfig
from posenc_lab.positional import SCHEME_NAMES, SCHEMES, build_scheme, schemes_of_kind
from posenc_lab_analysis import ablate
from posenc_lab_analysis.report import ReportSettings

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
        build_scheme(mc.posenc, mc.dims, **mc.posenc_kwargs).validate(
            run.data.segment_len, mc.mem_len, run.data.episode_len or 0
        )
        assert run.seed == spec.seed


def test_default_preset_is_ablation():
    cfg = ablate.compose("ablate", [])
    assert cfg.ablate.name == "ablation" and cfg.data.name == "pystdlib"


def test_unknown_override_is_an_error(capsys):
    assert ablate.main(["experiment=quick", "ablate.no_such_key=1", "--plan"]) == 2
    assert "no_such_key" in capsys.readouterr().err


def plan(preset: str, *overrides: str):
    args = [f"experiment={preset}", *overrides]
    return ablate.plan(ablate.compose("ablate", args), args)


def test_seeds_train_every_cell_once_per_seed_and_extra_seeds_only_the_named_cells(tmp_path):
    specs = plan(
        "tiny", "ablate.seeds=[0,1]", "ablate.extra_seeds=[2,1]", "ablate.extra_seed_cells=[xl:mem,recall/xl:nomem]"
    )
    by_cell = ablate.seeds_by_cell(specs)
    assert by_cell.pop("xl:mem") == [0, 1, 2] and by_cell.pop("recall/xl:nomem") == [0, 1, 2]
    assert by_cell and all(seeds == [0, 1] for seeds in by_cell.values())
    names = [s.name for s in specs]
    assert len(set(names)) == len(names) and all(n.endswith(f"_seed{s.seed}") for n, s in zip(names, specs))
    spec = next(s for s in specs if s.cell == "xl:mem" and s.seed == 2)
    run = ablate.compose("train", [*spec.overrides, f"run_dir={tmp_path}"])
    assert run.seed == 2 and run.posenc.name == "xl" and run.model.mem_len > 0


@pytest.mark.parametrize(
    "override, message",
    [
        ("ablate.extra_seed_cells=[xl:memory]", "not in the grid: ['xl:memory']"),
        ("ablate.schemes=[xl,nosuch]", "unknown scheme(s) ['nosuch']"),
        ("ablate.seeds=[]", "ablate.seeds is empty"),
        ("ablate.seeds=[0,0]", "distinct integer seeds"),
        ("ablate.analysis.bootstrap.level=2", "ablate.analysis.bootstrap"),
    ],
)
def test_bad_grid_settings_are_refused_before_training(override, message, capsys, tmp_path):
    assert ablate.main(["experiment=tiny", f"ablate.out={tmp_path}", override]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_no_memory_schemes_limits_the_runs_without_memory():
    main = [s for s in plan("tiny", "ablate.no_memory_schemes=[xl]") if s.group == "main" and s.loss_frac == 1]
    assert {s.scheme for s in main if not s.mem_len} == {"xl"}
    assert {s.scheme for s in main if s.mem_len} == set(ablate.compose("ablate", ["experiment=tiny"]).ablate.schemes)


@pytest.fixture(scope="module")
def textfile(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text("The quick brown fox jumps over the lazy dog. " * 2000)
    return path


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_runs_on_any_corpus(preset, textfile, tmp_path):
    """`posenc-lab ablate data=textfile data.corpus.path=FILE` with every preset: the runs of the main
    grid load the file (presets carry no corpus-specific keys); the recall grid keeps its own data."""
    specs = plan(preset, "data=textfile", f"data.corpus.path={textfile}")
    for spec in representative(specs):
        run = ablate.compose("train", [*spec.overrides, f"run_dir={tmp_path / spec.name}"])
        corpus = build_datamodule(run.data).corpus  # loads it with the composed options
        assert corpus.name == ("recall" if spec.group == "recall" else "textfile")


def test_a_corpus_refuses_options_it_does_not_take(textfile, capsys, tmp_path):
    with pytest.raises(ValueError, match=r"'textfile' takes no option max_bytes .*its options: path, split"):
        load_corpus("textfile", path=textfile, max_bytes=1000)
    check_corpus_options("pystdlib", ["max_bytes", "include_tests"])  # its own options pass
    args = [
        "experiment=quick",
        f"ablate.out={tmp_path}",
        "data=textfile",
        f"data.corpus.path={textfile}",
        "+data.corpus.max_bytes=1000",
    ]
    assert ablate.main(args) == 2  # at planning, before any training
    assert "takes no option max_bytes" in capsys.readouterr().err and not (tmp_path / "runs").exists()


def test_ablate_names_no_scheme_in_its_code():
    """Scheme names live in the registry and the configs: no string in analysis/ablate.py names one."""
    tree = ast.parse(Path(ablate.__file__).read_text())
    words = {
        w
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        for w in re.findall(r"\w+", node.value)
    }
    assert not words & set(SCHEME_NAMES)


def test_continue_command_keeps_the_overrides_and_never_retrains(tmp_path):
    cmd = ablate.continue_command(
        ["experiment=quick", "ablate.retrain=true", "ablate.out=x", "optim.lr=1e-3"], tmp_path
    )
    assert cmd == f"posenc-lab ablate experiment=quick optim.lr=1e-3 ablate.out={tmp_path}"
