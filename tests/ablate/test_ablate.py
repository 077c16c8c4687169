"""`posenc-lab ablate`: every preset composes from the real conf/ groups into its grid and every run's
`posenc-lab train` config (the GPU preset included), bad settings are refused before training, and as a process
it trains runs concurrently and stops cleanly on Ctrl-C or SIGTERM, saying what was kept."""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from posenc_lab import ablate, config_dir
from posenc_lab.ablate.jobs import checkpoint_step, continue_command
from posenc_lab.ablate.outdir import AblationDir
from posenc_lab.ablate.plan import plan as make_plan
from posenc_lab.ablate.plan import seeds_by_cell
from posenc_lab.build import build_datamodule, model_config
from posenc_lab.checks import problems as config_problems
from posenc_lab.compose import compose
from posenc_lab.data import check_corpus_options, load_corpus
from posenc_lab.positional import SCHEME_NAMES, SCHEMES, build_scheme, schemes_of_kind
from posenc_lab.rundir import run_folder
from posenc_lab_analysis.report import ReportSettings
from tests.schemes import (
    ALIBI,
    FOX,
    GLOBAL_SINUSOID,
    LEARNED,
    NOPE,
    PATH,
    ROPE,
    SHAW,
    SINUSOID,
    STICKBREAKING,
    WALL,
    XL,
)

CONF = Path(config_dir())
PRESETS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml") if "\nablate:" in p.read_text())


# What a preset's opening comment says it is, pinned for the presets whose reports the project quotes (a new
# preset needs no entry: every preset is composed, planned and validated by the tests below, by glob).
# "steps": trainer.max_steps, "model": (n_layer, d_model), "lengths": (data.segment_len, model.mem_len); "seeds":
# every cell's seeds; "without_memory": the schemes also trained without memory; "recall": the recall probe's
# schemes.
REACH = {XL, SHAW, SINUSOID, LEARNED, GLOBAL_SINUSOID, ROPE, ALIBI, NOPE, FOX}
CLAIMS = {
    "ablation": dict(smoke=False, steps=1000, model=(4, 128), lengths=(32, 32),
                     seeds={"*": [0, 1], **dict.fromkeys(["shaw:mem32", "xl:mem32", "xl:nomem", "xl:win64",
                                                          "recall/xl:mem32", "recall/xl:nomem"], [0, 1, 2])},
                     without_memory={XL}, recall={XL}, half_loss=set()),
    "zoo": dict(smoke=False, steps=1000, model=(4, 128), lengths=(32, 32), seeds=[0], without_memory=set(),
                recall={XL, FOX, STICKBREAKING, PATH, WALL}, recall_without_memory={XL, FOX, STICKBREAKING, PATH, WALL},
                schemes="all"),
    "quick": dict(smoke=True, steps=120, model=(2, 64), lengths=(32, 32), half_loss={SINUSOID, XL}, recall=set()),
    "tiny": dict(smoke=True, steps=20, model=(2, 32), lengths=(16, 16), half_loss={SINUSOID, XL}, recall={XL}),
    # retrieval reach: the recall grid alone, with and without memory
    "reach": dict(smoke=False, steps=300, model=(2, 64), lengths=(16, 32), seeds=[0, 1], without_memory=set(),
                  half_loss=set(), recall=REACH, recall_without_memory=REACH),
    "reach_tiny": dict(smoke=True, steps=20, model=(2, 32), lengths=(16, 16), seeds=[0], without_memory=set(),
                       recall={XL, NOPE}, recall_without_memory={XL, NOPE}),
    # the recurrence question (memory_extends_xl_context) at L = M = 64: its cells alone
    "context": dict(smoke=False, steps=1000, model=(4, 128), lengths=(64, 64),
                    seeds={"*": [0], "xl:mem64": [0, 1, 2], "xl:nomem": [0, 1, 2], "xl:win128": [0, 1, 2]},
                    without_memory={XL},
                    half_loss=set(), recall=set(), schemes={XL, SHAW, SINUSOID}),
    "context_tiny": dict(smoke=True, steps=20, model=(2, 32), lengths=(16, 16),
                         seeds={"*": [0], "xl:mem16": [0, 1], "xl:nomem": [0, 1], "xl:win32": [0, 1]},
                         without_memory={XL},
                         half_loss=set(), recall=set(), schemes={XL, SHAW, SINUSOID}),
    # length generalization: the task grid alone, reverse x 22 cells, the verdicts' cells a third seed
    # the third attempt's claims (Kazemnejad et al., Ruoss et al.): their four cells without memory, 5 fresh seeds
    "lengthgen": dict(smoke=False, steps=12000, model=(4, 64), lengths=(24, 0), seeds=[100, 101, 102, 103, 104],
                      without_memory=set(), half_loss=set(), recall=set(), task_schemes={NOPE, SINUSOID, ROPE}),
    # positions the data gives (McLeish et al., Cho et al.): reversed addition, nope with each kind of ids against rope,
    # each with and without memory
    "lengthgen_addition": dict(smoke=False, steps=8000, model=(4, 64), lengths=(16, 32), seeds=[200, 201, 202],
                               without_memory=set(), half_loss=set(), recall=set(), task_schemes={NOPE, ROPE}),
    # the memory row: copy and reverse across segments through the memory, xl and rope against nope with Abacus ids
    "lengthgen_memory": dict(smoke=False, steps=8000, model=(4, 64), lengths=(8, 32), seeds=[300, 301, 302],
                             without_memory=set(), half_loss=set(), recall=set(), task_schemes={XL, ROPE, NOPE}),
    # the published finding (Ruoss et al.): reverse, sinusoid and rope with and without random positions, 3 seeds
    "lengthgen_finding": dict(smoke=False, steps=16000, model=(2, 64), lengths=(32, 32), seeds=[0, 1, 2],
                              without_memory=set(), half_loss=set(), recall=set(), task_schemes={SINUSOID, ROPE}),
    "lengthgen_tiny": dict(smoke=True, steps=12, model=(2, 32), lengths=(16, 16), seeds=[0], without_memory=set(),
                           half_loss=set(), recall=set()),
    "wt103_table6": dict(smoke=False, steps=200_000, model=(16, 410), lengths=(150, 150), seeds=[0],
                         half_loss={SINUSOID, LEARNED, GLOBAL_SINUSOID, SHAW, XL}, recall=set()),
}  # fmt: skip


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_is_what_its_comment_says_and_validates(preset, tmp_path):
    cfg = compose("ablate", [f"experiment={preset}", f"ablate.out={tmp_path}"])
    specs = make_plan(cfg, [f"experiment={preset}"])
    assert cfg.ablate.name == preset and specs
    # every run of the preset is a valid `posenc-lab train` config (the one validator, nothing loaded)
    run = compose("train", [*specs[0].overrides, f"run_dir={tmp_path / specs[0].name}"])
    assert config_problems(run, "train") == []
    claims = CLAIMS.get(preset)
    if claims is None:
        return
    assert bool(cfg.ablate.smoke) == claims["smoke"]
    assert (cfg.trainer.max_steps, (cfg.model.n_layer, cfg.model.d_model)) == (claims["steps"], claims["model"])
    assert (cfg.data.segment_len, cfg.model.mem_len) == claims["lengths"]
    main = [s for s in specs if s.group is None]
    if "seeds" in claims:  # every cell's seeds, or {cell: seeds} with "*" for the others
        want = claims["seeds"] if isinstance(claims["seeds"], dict) else {"*": claims["seeds"]}
        for cell, seeds in seeds_by_cell(specs).items():
            assert seeds == want.get(cell, want["*"]), cell
    if "without_memory" in claims:
        assert {s.scheme for s in main if s.mem_len == 0} == claims["without_memory"]
    if claims.get("schemes") == "all":
        assert {s.scheme for s in main} == set(SCHEMES)
    elif "schemes" in claims:
        assert {s.scheme for s in main} == claims["schemes"]
    if "half_loss" in claims:
        assert {s.scheme for s in main if s.loss_frac != 1.0} == claims["half_loss"]
    if "task_schemes" in claims:  # a task grid of its own cells (a finding's)
        assert {s.scheme for s in specs if s.group} == claims["task_schemes"]
    assert {s.scheme for s in specs if s.group == "recall"} == claims["recall"]
    if "recall_without_memory" in claims:
        assert {s.scheme for s in specs if s.group == "recall" and s.mem_len == 0} == claims["recall_without_memory"]
    for spec in [s for s in specs if s.window][:1]:  # a window of the same span: its own overrides, validated too
        window = compose("train", [*spec.overrides, f"run_dir={tmp_path / spec.name}"])
        assert config_problems(window, "train") == [] and window.data.segment_len == sum(claims["lengths"])


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
    cfg = compose("ablate", [f"experiment={preset}", f"ablate.out={tmp_path}"])
    specs = make_plan(cfg, [f"experiment={preset}"])
    main = [s for s in specs if s.group is None] or specs  # the reach presets: the recall grid alone
    schemes = {s.scheme for s in main}  # the five: every absolute scheme, at least two relative ones
    claims = CLAIMS.get(preset, {})
    own = isinstance(claims.get("schemes"), set) or "task_schemes" in claims or preset not in CLAIMS  # its own cells
    if not cfg.ablate.smoke and not own:
        assert schemes >= set(schemes_of_kind("absolute")) and len(schemes & set(schemes_of_kind("relative"))) >= 2
    if preset == "zoo":  # every registered scheme, with memory only, and a sink and a gate on rope and xl
        assert schemes == set(SCHEMES) and all(s.mem_len > 0 for s in main)
        assert {"rope+sink:mem32", "rope+gate:mem32", "xl+sink:mem32", "xl+gate:mem32"} <= {s.cell for s in main}
    elif preset == "lengthgen_memory":  # the memory row: with memory only
        assert {s.mem_len > 0 for s in main} == {True}
    elif preset not in ("lengthgen_finding", "lengthgen"):  # published claims: no memory
        assert {s.mem_len > 0 for s in main} == {True, False}  # with and without memory
    ReportSettings.read(OmegaConf.to_container(cfg.ablate.analysis))  # the analysis block is valid
    for spec in specs if every_run else representative(specs):
        run = compose("train", [*spec.overrides, f"run_dir={tmp_path / spec.name}"])
        assert run.posenc.name == spec.scheme and run.model.mem_len == spec.mem_len
        assert run.model.loss_recent_frac == spec.loss_frac
        # the run's scheme is built with its options sized to the run, and serves the training lengths
        cutoffs = run.model.get("adaptive_cutoffs")  # wt103_table6: WikiText-103's 267,735 words
        mc = model_config(run, vocab_size=267_735 if cutoffs else 256)
        build_scheme(mc.posenc, mc.dims, **mc.posenc_kwargs).validate(
            run.data.segment_len, mc.mem_len, run.data.episode_len or 0
        )
        assert run.seed == spec.seed


def test_default_preset_is_ablation():
    cfg = compose("ablate", [])
    assert cfg.ablate.name == "ablation" and cfg.data.name == "pystdlib"


def test_unknown_override_is_an_error(capsys):
    assert ablate.main(["experiment=quick", "ablate.no_such_key=1", "--plan"]) == 2
    assert "no_such_key" in capsys.readouterr().err


def test_a_power_statement_that_cannot_be_made_is_one_line(capsys, tmp_path):
    """More streams than the split holds tokens: the plan names the split and the streams, exit 2."""
    args = ["experiment=quick", f"ablate.out={tmp_path}", "ablate.analysis.trained.n_streams=100000000", "--plan"]
    assert ablate.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("posenc-lab ablate: error: the power statement: the test split (") and "\n" not in err
    assert err.endswith("tokens) is too short for 100000000 streams")


def plan(preset: str, *overrides: str):
    args = [f"experiment={preset}", *overrides]
    return make_plan(compose("ablate", args), args)


def test_seeds_train_every_cell_once_per_seed_and_extra_seeds_only_the_named_cells(tmp_path):
    specs = plan(
        "tiny", "ablate.seeds=[0,1]", "ablate.extra_seeds=[2,1]", "ablate.extra_seed_cells=[xl:mem,recall/xl:nomem]"
    )
    by_cell = seeds_by_cell(specs)
    assert by_cell.pop("xl:mem16") == [0, 1, 2] and by_cell.pop("recall/xl:nomem") == [0, 1, 2]
    assert by_cell and all(seeds == [0, 1] for seeds in by_cell.values())
    names = [s.name for s in specs]
    assert len(set(names)) == len(names) and all(n.endswith(f"_seed{s.seed}") for n, s in zip(names, specs))
    spec = next(s for s in specs if s.cell == "xl:mem16" and s.seed == 2)
    run = compose("train", [*spec.overrides, f"run_dir={tmp_path}"])
    assert run.seed == 2 and run.posenc.name == "xl" and run.model.mem_len > 0


@pytest.mark.parametrize(
    "override, message",
    [
        ("ablate.extra_seed_cells=[xl:memory]", "ablate.extra_seed_cells: 'xl:memory' is not a cell"),
        ("ablate.extra_seed_cells=[shaw:mem:half]", "not in the grid: ['shaw:mem:half']"),
        ("ablate.schemes=[xl,nosuch]", "unknown scheme(s) ['nosuch']"),
        ("ablate.seeds=[]", "ablate.seeds is empty"),
        ("ablate.seeds=[0,0]", "distinct integer seeds"),
        ("ablate.analysis.level=2", "ablate.analysis.level must be in (0, 1)"),
        ("ablate.jobs=0", "ablate.jobs must be an integer >= 1"),
        (
            "+ablate.analysis.context.nosuch=1",
            "ablate.analysis.context.nosuch is not a key of ablate.analysis.context; the keys are: c_max, c_min,",
        ),
        ("ablate.analysis.extrapolation.n_rows=many", "ablate.analysis.extrapolation.n_rows: Value 'many'"),
        ("ablate.analysis.sections=[data,nosuch]", "'nosuch' is not a registered section; the sections: "),
        ("optim.lr=-1", "optim.lr must be a number > 0, got -1"),
    ],
)
def test_bad_grid_settings_are_refused_before_training(override, message, capsys, tmp_path):
    assert ablate.main(["experiment=tiny", f"ablate.out={tmp_path}", override]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_no_memory_schemes_limits_the_runs_without_memory():
    main = [s for s in plan("tiny", "ablate.no_memory_schemes=[xl]") if s.group is None and s.loss_frac == 1]
    assert {s.scheme for s in main if not s.mem_len} == {"xl"}
    assert {s.scheme for s in main if s.mem_len} == set(compose("ablate", ["experiment=tiny"]).ablate.schemes)


@pytest.fixture(scope="module")
def textfile(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text("The quick brown fox jumps over the lazy dog. " * 2000)
    return path


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_runs_on_any_corpus(preset, textfile, tmp_path):
    """`posenc-lab ablate data=textfile data.corpus.path=FILE` with every preset: the runs of the main
    grid load the file (presets carry no corpus-specific keys); the recall grid keeps its own data."""
    if not any(s.group is None for s in plan(preset)):
        pytest.skip(f"{preset} has no language-corpus grid for data= to choose (only the recall probe or a task grid)")
    specs = plan(preset, "data=textfile", f"data.corpus.path={textfile}")
    for spec in representative(specs):
        run = compose("train", [*spec.overrides, f"run_dir={tmp_path / spec.name}"])
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


def test_the_analysis_names_no_scheme_in_its_code():
    """Scheme names live in the registry, conf/ and conf/paper.yaml: no string of analysis/'s code, nor of ablate's
    (its plan and its command), names one (docstrings may show examples)."""
    import posenc_lab_analysis

    paths = [*Path(posenc_lab_analysis.__file__).parent.rglob("*.py"), *Path(ablate.__file__).parent.rglob("*.py")]
    assert len(paths) > 10
    for path in paths:
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        words = {
            w
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
            for w in re.findall(r"\w+", node.value)
        }
        assert not words & set(SCHEME_NAMES), (path, words & set(SCHEME_NAMES))


def test_continue_command_keeps_the_overrides_and_never_retrains(tmp_path):
    cmd = continue_command(["experiment=quick", "ablate.retrain=true", "ablate.out=x", "optim.lr=1e-3"], tmp_path)
    assert cmd == f"posenc-lab ablate experiment=quick optim.lr=1e-3 'ablate.out='\"'\"'{tmp_path}'\"'\"''"


# ---- as a process -----------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
# the tiny preset cut to one scheme with and without memory: the machinery, in seconds per run
SMALL_GRID = ["experiment=tiny", "ablate.schemes=[xl]", "ablate.half_loss.schemes=[]", "ablate.recall.schemes=[]"]


def ablate_process(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "posenc_lab.ablate", *args],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def test_jobs_train_runs_concurrently_one_per_seed(tmp_path):
    args = (
        *SMALL_GRID,
        "ablate.seeds=[0,1]",
        "ablate.jobs=2",
        f"ablate.out={tmp_path}",
        "--train-only",
        "trainer.max_steps=30",
    )
    proc = ablate_process(*args)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, out + err
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert runs == ["xl_mem0_full_seed0", "xl_mem0_full_seed1", "xl_mem16_full_seed0", "xl_mem16_full_seed1"]
    for name in runs:
        res = json.loads((tmp_path / "runs" / name / "results.json").read_text())
        assert res["seed"] == int(name[-1]) and res["steps"] == 30
    # seeds differ in their initialisation only, so their losses differ
    vals = {json.loads((tmp_path / "runs" / n / "results.json").read_text())["val"]["loss"] for n in runs}
    assert len(vals) == 4
    # the second run started before the first finished: two at a time
    events = [("start" if "(pid" in line else "done") for line in out.splitlines() if re.search(r"\] \[\d/4\]", line)]
    assert events[:2] == ["start", "start"], out
    times = json.loads((tmp_path / "grid.json").read_text())["trials"]
    assert set(times) == set(runs) and all(t["cpu_s"] > 0 and t["status"] == "trained" for t in times.values())
    # rerun: every run is reused, nothing trains
    again = ablate_process(*args)
    out, err = again.communicate(timeout=600)
    assert again.returncode == 0, out + err
    assert out.count(": reused (") == 4 and "(pid" not in out


@pytest.mark.parametrize(("jobs", "signum"), [(1, signal.SIGINT), (2, signal.SIGTERM)])
def test_a_signal_stops_cleanly_and_says_how_to_continue(jobs, signum, tmp_path, capsys):
    proc = ablate_process(
        *SMALL_GRID, f"ablate.jobs={jobs}", f"ablate.out={tmp_path}", "trainer.max_steps=100000", "checkpoint_every=5"
    )
    deadline = time.monotonic() + 300
    started = False
    while time.monotonic() < deadline and not started:  # until a run is training and has a checkpoint
        started = any((tmp_path / "runs").glob("*/checkpoints/last.ckpt"))
        time.sleep(0.5)
    assert started, "no run started training in time"
    if jobs == 1:  # a second ablate into the folder the first one writes: refused in one line, nothing touched
        assert ablate.main([*SMALL_GRID, f"ablate.out={tmp_path}", "--train-only"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"ablate.out {tmp_path} is being written by another process (pid {proc.pid}" in err[0]
    time.sleep(1.0)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 128 + signum, out + err
    assert "Traceback" not in out + err
    assert f"stopped by {signal.Signals(signum).name}" in err and "during training of xl_mem16_full_seed0" in err
    assert re.search(r"xl_mem16_full_seed0: continues from its checkpoint at step \d+", err), err
    assert "Kept: 0 of " in err
    again = [*SMALL_GRID, f"ablate.jobs={jobs}", "trainer.max_steps=100000", "checkpoint_every=5"]
    line = next(x for x in err.splitlines() if x.startswith("Continue with: "))
    assert line.startswith(f"Continue with: posenc-lab ablate {shlex.join(again)} ")
    assert shlex.split(line)[-1] == f"ablate.out='{tmp_path}'"  # quoted for a shell, then for Hydra
    pids = [int(p) for p in re.findall(r"\(pid (\d+)", out)]  # the training processes were stopped too
    assert pids and not any(Path(f"/proc/{p}").exists() for p in pids)
    if jobs == 1:  # the printed command, run as printed, continues the run past the step it was stopped at
        step = int(re.search(r"xl_mem16_full_seed0: continues from its checkpoint at step (\d+)", err)[1])
        proc = printed_process(line.split(": ", 1)[1])
        run = tmp_path / "runs" / "xl_mem16_full_seed0"
        advanced = _wait(lambda: (checkpoint_step(run) or 0) > step, 300)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=180)
        assert advanced and proc.returncode == 130, out + err
        assert "xl:mem16, seed 0: resuming (pid" in out and checkpoint_step(run) > step


def printed_process(command: str) -> subprocess.Popen:
    """A command ablate printed (``posenc-lab ablate ...``), run as printed: through the console script."""
    argv = shlex.split(command)
    assert argv[:2] == ["posenc-lab", "ablate"], command
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "posenc-lab"), *argv[1:]],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _wait(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.5)
    return False


def test_a_killed_run_is_continued_by_the_printed_command(tmp_path):
    """A training process killed by SIGKILL (the out-of-memory killer, say) fails the grid; the line after it names
    the checkpoint the run continues from and the command, which, run as printed, finishes the run from there."""
    args = (*SMALL_GRID, "ablate.recurrence=[true]", "trainer.max_steps=300", "checkpoint_every=5")
    proc = ablate_process(*args, f"ablate.out={tmp_path}", "--train-only")
    run = tmp_path / "runs" / "xl_mem16_full_seed0"
    assert _wait(lambda: (checkpoint_step(run) or 0) > 0, 300), "no checkpoint in time"
    (child,) = [p for p in Path("/proc").glob("[0-9]*") if _parent(p) == proc.pid]  # the training process
    os.kill(int(child.name), signal.SIGKILL)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 1, out + err
    assert "training xl_mem16_full_seed0 was killed by SIGKILL" in out, out
    advice = out.strip().splitlines()[-1]
    step = int(
        re.search(r"xl_mem16_full_seed0 trains again from its checkpoint at step (\d+): continue with: ", advice)[1]
    )
    assert "no run finished" in advice and step < 300
    again = printed_process(advice.split("continue with: ", 1)[1])
    out, err = again.communicate(timeout=600)
    assert again.returncode == 0, out + err
    results = json.loads((run / "results.json").read_text())
    assert results["steps"] == 300 and results["resumed_from"].endswith(".ckpt"), results


def _parent(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def test_damaged_files_of_a_finished_grid_are_named_and_odd_paths_work(tmp_path, capsys):
    """An ablate.out with `(` and `$(` in it trains (run_dir= is quoted for Hydra); a damaged results.json or
    config.yaml of a finished run, and a damaged grid.json (the grid's state and the folder's mark), are named in one
    line with what to do."""
    out = tmp_path / "a (b) $(c)"
    args = [*SMALL_GRID, "ablate.recurrence=[true]", "trainer.max_steps=2", f"ablate.out='{out}'", "--train-only"]
    assert ablate.main(args) == 0
    run = out / "runs" / "xl_mem16_full_seed0"
    assert (run / "results.json").is_file() and json.loads((run / "results.json").read_text())["steps"] == 2
    # the run folder is the grid's rule, and the grid's one state file records the run: folder, overrides, seconds
    (spec,) = make_plan(compose("ablate", args[:-1]), args[:-1])
    entry = json.loads((out / "grid.json").read_text())["trials"][spec.name]
    assert run == run_folder(out, spec.name) and entry["run_dir"] == str(run_folder(out, spec.name))
    assert entry["overrides"] == list(spec.trial.overrides) and entry["status"] == "trained" and entry["cpu_s"] > 0
    assert json.loads((out / "grid.json").read_text())["ablate"]["made_by"] == "posenc-lab ablate"  # its mark
    (out / "grid.json").write_text('{"xl_mem16')
    capsys.readouterr()
    assert ablate.main(args) == 2  # the mark is in it: whose folder it is cannot be read (test_outdir.py)
    err = capsys.readouterr().err
    assert f"{out / 'grid.json'} is corrupt" in err and f"delete {out / 'grid.json'} and rerun" in err
    assert len(err.strip().splitlines()) == 1
    (out / "grid.json").unlink()  # what it says: the run is recognised and reused
    assert ablate.main(args) == 0 and f"{spec.name}: reused" in capsys.readouterr().out
    good = (run / "results.json").read_text()
    (run / "results.json").write_text('{"val": {"loss": 1.')
    assert ablate.main(args) == 2
    err = capsys.readouterr().err
    assert f"{run / 'results.json'} is corrupt" in err and "delete it" in err and len(err.strip().splitlines()) == 1
    (run / "results.json").write_text(good)
    (run / "config.yaml").write_text("posenc: [unclosed\n")
    assert ablate.main(args) == 2
    assert f"{run / 'config.yaml'} is corrupt" in capsys.readouterr().err


def test_a_users_file_in_a_run_folder_is_named_before_training_and_no_command_is_offered(tmp_path, capsys):
    """A planned run's folder that holds a file of another's: its training would be refused, and so would every rerun
    of the same command. It is named before anything trains, with what to move (no "continue with"), and is never
    deleted, not even by ablate.retrain; once it is moved out, the same command trains the grid."""
    out = tmp_path / "out"
    args = [*SMALL_GRID, "ablate.recurrence=[true]", "trainer.max_steps=2", f"ablate.out={out}", "--train-only"]
    assert ablate.main([*args, "+trainer.no_such_argument=1"]) == 2  # refused by the validator before training
    assert not (out / "runs").exists()
    AblationDir(out).claim()  # a folder an earlier ablate made, where a run directory holds a file of another's
    notes = out / "runs" / "xl_mem16_full_seed0" / "notes.txt"
    notes.parent.mkdir(parents=True)
    notes.write_text("not a run")
    capsys.readouterr()
    for retrain in ([], ["ablate.retrain=true"]):
        assert ablate.main([*args, *retrain]) == 2
        printed = capsys.readouterr()
        (line,) = printed.err.strip().splitlines()
        assert f"{notes}; move them out of {out / 'runs'}" in line and "then rerun the same command" in line
        assert "continue with" not in (printed.out + printed.err).lower()
        assert notes.read_text() == "not a run" and sorted(notes.parent.iterdir()) == [notes]
    notes.rename(tmp_path / "notes.txt")
    assert ablate.main(args) == 0
    assert json.loads((notes.parent / "results.json").read_text())["steps"] == 2
    # a run left unfinished, continued with other settings: its training would be refused on every rerun too
    (notes.parent / "results.json").unlink()
    capsys.readouterr()
    assert ablate.main([*args, "optim.lr=0.0123"]) == 2
    printed = capsys.readouterr()
    (line,) = printed.err.strip().splitlines()
    assert f"{notes.parent} holds a run with other settings (optim.lr: run " in line and ", now 0.0123)" in line
    assert "ablate.retrain=true to train it again" in line and "continue with" not in printed.out.lower()
    assert ablate.main([*args, "optim.lr=0.0123", "ablate.retrain=true"]) == 0  # what the line offers works
    assert json.loads((notes.parent / "run.json").read_text())["identity"]["optim"]["lr"] == 0.0123


def test_the_plan_states_what_a_task_grids_seeds_detect(capsys, tmp_path):
    """A task grid alone (no language-corpus cells): `--plan` states the task verdicts' power, counting the claims
    of conf/lengthgen_paper.yaml whose both cells the grid trains with 2 seeds or more."""
    assert ablate.main(["experiment=lengthgen_finding", f"ablate.out={tmp_path}", "--plan"]) == 0
    out = capsys.readouterr().out
    assert "# power (task verdicts): 2 claim(s) the report will judge" in out and "same 128 test instances" in out
    assert re.search(r"#   3 seeds a cell: detects a difference of 0\.\d+ in exact match", out)
    one = ["experiment=lengthgen_finding", f"ablate.out={tmp_path}", "ablate.seeds=[0]", "--plan"]
    assert ablate.main(one) == 0
    out = capsys.readouterr().out
    assert "0 claim(s)" in out and "1 seed a cell: no task verdict is judged" in out


TINY_PRESETS = sorted(p for p in PRESETS if p.endswith("_tiny") or p == "tiny")


@pytest.mark.slow  # each is also run by its own section's test; this one finds a new tiny preset with no edit
@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_every_tiny_preset_runs_to_its_report(preset, tmp_path):
    out = tmp_path / preset
    assert ablate.main([f"experiment={preset}", f"ablate.out={out}", "ablate.jobs=2"]) == 0
    assert (out / "report" / "report.md").is_file()
