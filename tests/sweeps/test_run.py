"""posenc-lab sweep: wandb's own sweep engine (the `sweeps` library, no fake) proposes the trials, the trials run
through the sweep file's command as tiny CPU runs, their metrics go back to the engine, hyperband stops a bad
trial, a failing trial is recorded, a rerun continues, and bad input is refused before any compute."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from posenc_lab.ablate.outdir import AblationDir
from posenc_lab.grid import log_file
from posenc_lab.rundir import run_folder
from posenc_lab.runlock import RunLock
from posenc_lab.sweeps import engine, load_sweep
from posenc_lab.sweeps.check import check_sweep
from posenc_lab.sweeps.command import merge_overrides
from posenc_lab.sweeps.run import main
from posenc_lab.sweeps.state import SweepState
from posenc_lab.sweeps.table import seed_mean_interval, sweep_frame, write_table
from tests.helpers_train import CORPUS
from tests.schemes import FOX, PATH, ROPE, STICKBREAKING
from tests.sweeps.helpers import REPO, SWEEPS, read_wandb_records, state_of, sweep_file, wandb_run_summary
from tests.test_slurm import slurm  # noqa: F401 - the real one-node SLURM fixture, for the slow SLURM test

# every trial: a tiny model on a small corpus, a validation every 2 steps (later overrides replace the file's)
TINY = [
    "model=tiny",
    "trainer=cpu",
    "data.segment_len=16",
    "data.batch_size=4",
    "trainer.max_steps=6",
    "trainer.val_check_interval=2",
    "trainer.limit_val_batches=2",
    "trainer.num_sanity_val_steps=0",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "final_eval.limit_batches=2",
    "optim.warmup_steps=2",
]


def tiny(data: str = "recall", **changes: object) -> list[str]:
    overrides = [*TINY, *CORPUS[data]]
    for key, value in changes.items():
        overrides = [o for o in overrides if o.split("=")[0] != key] + [f"{key}={value}"]
    return overrides


@pytest.fixture
def here(tmp_path, monkeypatch):
    """Run in tmp_path (the sweep files' run dirs are relative), trials with one thread, wandb offline and quiet."""
    monkeypatch.chdir(tmp_path)
    for key, value in {
        "OMP_NUM_THREADS": "1",
        "POSENC_LAB_CACHE": str(tmp_path / "cache"),
        "WANDB_SILENT": "true",
        "WANDB_MODE": "offline",
    }.items():
        monkeypatch.setenv(key, value)
    return tmp_path


# ---- no training ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command, extra, expected",
    [
        (["model=small", "trainer=gpu"], ["model=tiny"], ["trainer=gpu", "model=tiny"]),  # replaces, no clash
        (["+callbacks.x.a=1"], ["callbacks.x.a=2"], ["++callbacks.x.a=2"]),  # the command added the key
        (["trainer.max_steps=5"], ["+trainer.max_steps=6"], ["++trainer.max_steps=6"]),
        (["+callbacks.x.a=1"], ["~callbacks.x.a"], []),  # added, then removed: neither
        (["logger=wandb"], ["~logger"], ["~logger"]),
        (["a=1", "b=2"], ["c=3"], ["a=1", "b=2", "c=3"]),
    ],
)
def test_extra_overrides_replace_the_commands(command, extra, expected):
    assert merge_overrides(command, extra) == expected


def test_extra_overrides_compose_where_the_command_sets_the_key():
    """Hydra itself takes the merged line of a sweep file's trial (it refuses a key given twice)."""
    from posenc_lab.compose import compose
    from posenc_lab.sweeps import load_sweep

    sweep = load_sweep(REPO / "sweeps" / "bayes_xl.yaml")
    line = merge_overrides(sweep.combinations()[0], ["model=tiny", "trainer=cpu", "model.mem_len=16"])
    cfg = compose("train", line)
    assert cfg.model.d_model == compose("train", ["model=tiny"]).model.d_model
    assert cfg.model.mem_len == 16 and cfg.trainer.accelerator == "cpu"


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--count", "0"], "--count 0: a sweep runs at least one trial"),
        (["--jobs", "0"], "--jobs 0: at least one trial runs at a time"),
        (["model=huge"], "do not compose"),
        (["trainer.max_steps=-3"], "trainer.max_steps"),
        (["posenc=rope"], "override 'posenc=rope' sets a swept parameter"),
        (
            ["model"],
            "model is not an override (KEY=VALUE, GROUP=OPTION, +KEY=VALUE, ++KEY=VALUE or ~KEY); a group "
            "takes an option: model=OPTION, one of ",
        ),
        (["--jobs", "two"], "argument --jobs: invalid int value: 'two'"),
    ],
)
def test_bad_input_is_one_line_before_any_compute(here, capsys, args, expected):
    out = here / "out"
    try:
        status = main([str(REPO / "sweeps" / "ablation_recall.yaml"), "--out", str(out), *args])
    except SystemExit as e:  # argparse's own
        status = e.code
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err, err
    assert not out.exists() and not (here / "runs").exists()


def test_bad_sweep_files_are_one_line(here, capsys):
    assert main([str(here / "missing.yaml")]) == 2
    assert "no such sweep file" in capsys.readouterr().err
    bad = sweep_file(here, parameters={"model.men_len": {"values": [0]}})
    assert main([str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "did you mean 'model.mem_len'" in err
    bayes = REPO / "sweeps" / "bayes_xl.yaml"
    assert main([str(bayes), *tiny("pystdlib")]) == 2
    assert "proposes trials without end; give --count N" in capsys.readouterr().err
    hb = sweep_file(here, early_terminate={"type": "hyperband"})  # wandb's schema: min_iter or max_iter
    assert main([str(hb), "--count", "1"]) == 2
    assert "wandb's sweep engine rejects it" in capsys.readouterr().err


def test_a_sweep_file_that_runs_another_program_is_refused_before_anything_runs(here, capsys):
    """The probe's file: its command runs bash, which touches a marker, then the trainer. `posenc-lab
    sweep` refuses it in one line naming the command (wandb agent runs such files), and nothing runs or is written.
    """
    command = ["bash", "-c", 'touch MARKER; exec "$0" "$@"', "posenc-lab", "train", "${args_no_hyphens}"]
    recall = yaml.safe_load((REPO / "sweeps" / "ablation_recall.yaml").read_text())["command"]
    path = sweep_file(here, command=command + recall[recall.index("${args_no_hyphens}") + 1 :])
    out = here / "out"
    assert main([str(path), "--out", str(out), *tiny()]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "command ['bash', '-c', 'touch MARKER;" in err, err
    assert "posenc-lab sweep runs nothing else" in err and "wandb agent remains the way" in err
    assert not (here / "MARKER").exists() and not out.exists() and not (here / "runs").exists()


def test_a_rerun_with_other_overrides_or_another_file_is_refused(here, capsys):
    path = REPO / "sweeps" / "ablation_recall.yaml"
    spec = yaml.safe_load(path.read_text())
    state = SweepState.open(here / "out", path, spec, ["model=tiny"])
    state.save()
    assert main([str(path), "--out", str(here / "out"), "model=small"]) == 2
    err = capsys.readouterr().err
    assert "holds another sweep" in err and "overrides: then model=tiny, now model=small" in err
    other = sweep_file(here, parameters={"posenc": {"values": ["xl"]}})
    assert main([str(other), "--out", str(here / "out"), "model=tiny"]) == 2
    assert "sweep file.parameters.posenc.values" in capsys.readouterr().err


def test_a_second_runner_into_the_same_out_is_refused_in_one_line(here, capsys):
    """One runner per sweep folder, under the one lock of run folders and ablate's (runlock.RunLock): it names the
    process that holds it, and nothing of the second is written."""
    path = REPO / "sweeps" / "ablation_recall.yaml"
    out = here / "out"
    with RunLock(out, key="--out"):
        assert main([str(path), "--out", str(out), *tiny()]) == 2
        err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--out {out} is being written by another process (pid {os.getpid()}" in err
    assert sorted(p.name for p in out.iterdir()) == [] and not (here / "runs").exists()


def test_bayes_proposes_from_the_fed_back_metrics():
    """The engine's Gaussian process is fit on the metrics given: shifted metrics shift its prediction by as
    much, and the same trials and seed propose the same parameters."""
    spec = yaml.safe_load((REPO / "sweeps" / "bayes_xl.yaml").read_text())
    trials = []
    for i, value in enumerate([2.0, 1.5, 1.8]):
        params, _ = engine.propose(spec, trials, seed=7)
        trials.append({"id": f"t{i}", "params": params, "state": "finished", "history": [[2, value]], "metric": value})
    params, info = engine.propose(spec, trials, seed=7)
    assert engine.propose(spec, trials, seed=7) == (params, info)
    assert info["predicted_value_std_dev"] is not None  # a fitted GP, not the first random draw
    shifted = [{**t, "metric": t["metric"] + 10, "history": [[2, t["metric"] + 10]]} for t in trials]
    params_shifted, info_shifted = engine.propose(spec, shifted, seed=7)
    assert params_shifted == params
    assert info_shifted["predicted_value"] == pytest.approx(info["predicted_value"] + 10, abs=1e-6)
    with_running = [*trials, {"id": "r", "params": params, "state": "running", "history": [], "metric": None}]
    assert engine.propose(spec, with_running, seed=7)[0] != params  # a running trial is not proposed again


def test_table_interval_over_seeds(tmp_path):
    from scipy import stats

    values = [1.0, 1.2, 0.9]
    mean, low, high = seed_mean_interval(values, 0.95)
    assert low == low
    half = stats.t.ppf(0.975, 2) * stats.sem(values)
    assert mean == pytest.approx(sum(values) / 3) and (low, high) == pytest.approx((mean - half, mean + half))
    spec = {"name": "s", "method": "grid", "metric": {"name": "val/loss", "goal": "minimize"}}
    spec["parameters"] = {"optim.lr": {"values": [0.1, 0.01]}, "seed": {"values": [0, 1, 2]}}
    state = SweepState.open(tmp_path, tmp_path / "s.yaml", spec, [])
    for i, (lr, seed) in enumerate([(0.1, 0), (0.1, 1), (0.1, 2), (0.01, 0)]):
        trial = state.add_trial({"optim.lr": lr, "seed": seed}, None)
        trial.update(state="finished", metric=values[i] if lr == 0.1 else 2.0, run_dir=str(tmp_path / trial["id"]))
    state.add_trial({"optim.lr": 0.01, "seed": 1}, None).update(state="failed", error="boom")
    write_table(state)
    frame = sweep_frame(state)
    assert list(frame["state"]) == ["finished"] * 4 + ["failed"] and frame["value"].isna().sum() == 1
    md = (tmp_path / "sweep.md").read_text()
    assert "val/loss = 0.9 with optim.lr=0.1 seed=2" in md
    assert f"over its 3 seeds: mean {mean:.4g}, 95% t-interval over seeds of the final metric [{low:.4g}" in md
    assert (tmp_path / "sweep.png").stat().st_size > 0 and (tmp_path / "sweep.csv").is_file()


def test_the_table_takes_the_level_and_the_estimator_from_the_analysis_by_one_route(monkeypatch):
    """The level is the analysis settings' (conf_block: a changed block changes it), not a second reading of
    conf/ablate.yaml; the interval is the analysis' one estimator's (stats.mean_interval), imported, not found
    through package metadata."""
    from posenc_lab.sweeps import table
    from posenc_lab_analysis import settings, stats

    block = {**settings.conf_block(), "level": 0.8}
    monkeypatch.setattr(settings, "_conf_analysis", lambda: block)
    assert table.level() == 0.8
    assert table.mean_interval is stats.mean_interval
    intervals = [table.seed_mean_interval([1.0, 2.0, 1.5], 0.9) for _ in range(3)]
    assert intervals[0] == intervals[2] and intervals[0][1] < 1.5 < intervals[0][2]


def test_an_earlier_versions_sweep_json_is_read_and_becomes_grid_json_once(here, capsys):
    """A sweep folder of an earlier version, its state in sweep.json: the same command continues it (here its
    count is reached: nothing trains); the state becomes grid.json at the first save, said in one line, and
    sweep.json is gone. The trial keeps every key it had, with the grid's status of its state."""
    path = sweep_file(here)
    out, overrides = here / "out", tiny()
    done = {
        "id": "abcd1234", "number": 0, "params": {"posenc": "xl", "model.mem_len": 0}, "state": "finished",
        "run_dir": str(out / "runs" / "abcd1234"), "log": str(out / "logs" / "abcd1234.log"), "history": [[2, 0.5]],
        "metric": 0.5, "steps": 6, "stopped_at": None, "returncode": 0, "error": None, "search_info": None,
        "started": "2026-01-01T00:00:00", "ended": "2026-01-01T00:01:00",
    }  # fmt: skip
    legacy = {
        "format": 1, "sweep_id": "sweep001", "seed": 3, "sweep_file": str(path), "sweep": load_sweep(path).spec,
        "overrides": overrides, "created": "2026-01-01T00:00:00", "trials": [done],
    }  # fmt: skip
    out.mkdir()
    (out / "sweep.json").write_text(json.dumps(legacy))
    capsys.readouterr()
    assert main([str(path), "--out", str(out), "--count", "1", *overrides]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if "sweep.json" in line]
    assert said == [f"posenc-lab sweep: {out / 'sweep.json'} (an earlier version's state) is now {out / 'grid.json'}"]
    assert not (out / "sweep.json").exists()
    state = state_of(out)
    assert state["sweep_id"] == "sweep001" and state["seed"] == 3 and state["overrides"] == overrides
    (trial,) = state["trials"]
    assert {k: trial[k] for k in done} == done and trial["status"] == "trained" and trial["wall_s"] is None
    assert "abcd1234" in (out / "sweep.md").read_text()
    assert main([str(path), "--out", str(out), "--count", "1", *overrides]) == 0  # once
    assert "sweep.json" not in capsys.readouterr().out and state_of(out) == state


def test_a_sweep_refuses_the_state_of_another_grid(here, capsys):
    out = here / "out"
    out.mkdir()
    AblationDir(out).claim()  # an ablation's: its grid.json, with its mark
    assert main([str(REPO / "sweeps" / "ablation_recall.yaml"), "--out", str(out), *tiny()]) == 2
    err = capsys.readouterr().err.strip()
    why = "is not a posenc-lab sweep's state (another grid's); use another --out"
    assert err == f"posenc-lab sweep: error: {out / 'grid.json'} {why}"


# ---- end to end, tiny trials ------------------------------------------------------------------------------


def test_a_grid_sweep_records_a_failing_trial_and_a_rerun_continues(here, capsys):
    """Three trials of a grid, two at a time, each job slot its device: the second one fails (a batch its
    corpus cannot hold, found only when the corpus loads); the sweep goes on, and a rerun of the same command
    reuses what ran."""
    path = sweep_file(here, parameters={"data.batch_size": {"values": [4, 100000, 2]}})
    out = here / "out"
    args = [str(path), "--out", str(out), "--jobs", "2", "--devices", "5,7"]
    args += [o for o in tiny() if not o.startswith("data.batch_size")]
    assert main([*args, "--count", "2"]) == 0
    first = state_of(out)
    assert [t["state"] for t in first["trials"]] == ["finished", "failed"]
    done, failed = first["trials"]
    assert failed["params"] == {"data.batch_size": 100000} and "too short for these streams" in failed["error"]
    # the trial ran as the sweep file's command: its hydra.run.dir, in the agent's environment, under --out
    sweep_id = first["sweep_id"]
    assert done["run_dir"] == str(out / "runs" / "sweeps" / sweep_id / done["id"])
    assert not (here / "runs").exists()  # nothing of the sweep outside --out
    results = json.loads((Path(done["run_dir"]) / "results.json").read_text())
    assert results["steps"] == 6 and done["metric"] == results["val"]["acc"]
    assert [s for s, _ in done["history"]] == [2, 4, 6]
    headers = [Path(t["log"]).read_text().splitlines()[0] for t in first["trials"]]  # env and command line
    assert f"WANDB_SWEEP_ID={sweep_id} WANDB_RUN_ID={done['id']} " in headers[0]
    assert {h.split("CUDA_VISIBLE_DEVICES=")[1].split()[0] for h in headers} == {"5", "7"}  # a device per job slot
    assert "-m posenc_lab.train data.batch_size=4 data=recall logger=wandb" in headers[0]  # the file's command
    assert "trainer.max_steps=2000" not in headers[0] and " trainer.max_steps=6 " in headers[0]  # replaced
    (wandb_file,) = Path(done["run_dir"]).rglob("run-*.wandb")  # no sweep id wandb's server would not know
    runs = [r.run for r in read_wandb_records(wandb_file) if r.WhichOneof("record_type") == "run"]
    assert runs and all(r.sweep_id == "" and r.project == "posenc-lab" for r in runs)
    info = wandb_run_summary(Path(done["run_dir"]))  # wandb offline, the sweep in its config and tags
    assert info["run_id"] == done["id"] and info["config"]["sweep"] == {"id": sweep_id, "name": "ablation-recall"}
    assert f"sweep-{sweep_id}" in info["tags"] and info["job_type"] == "ablation-recall"
    assert info["name"].endswith(f" ablation-recall/{done['id']}") and info["group"].startswith(f"sweep-{sweep_id}/")

    # a sweep folder of an earlier version, its trials' runs under the working directory: they stay where they are
    old = here / "runs" / "sweeps" / sweep_id / done["id"]
    old.parent.mkdir(parents=True)
    shutil.move(done["run_dir"], old)
    record = json.loads((out / "grid.json").read_text())
    record["trials"][done["id"]]["run_dir"] = str(old)
    (out / "grid.json").write_text(json.dumps(record))
    first = state_of(out)

    assert main(args) == 0  # the same command: the third grid point only, under --out
    second = state_of(out)
    added = second["trials"][2]
    assert added["run_dir"] == str(out / "runs" / "sweeps" / sweep_id / added["id"])
    assert second["sweep_id"] == sweep_id
    assert [t["state"] for t in second["trials"]] == ["finished", "failed", "finished"]
    assert second["trials"][:2] == first["trials"] and second["trials"][2]["params"] == {"data.batch_size": 2}
    assert Path(done["log"]).read_text().count("# ") == 1  # the finished trial did not run again
    rows = (out / "sweep.csv").read_text().splitlines()
    assert rows[0].startswith("trial,number,state,data.batch_size,metric,value") and len(rows) == 4
    assert (out / "sweep.png").is_file() and "**Best trial**" in (out / "sweep.md").read_text()


def test_a_trial_runs_in_the_grid_run_folder_and_the_grid_records_it(here):
    """A sweep file that names no folder: the trial's run folder is rundir.run_folder(--out, its id), and its entry
    in grid.json holds what the grid records of every trial (overrides, status, seconds) beside the sweep's."""
    spec = yaml.safe_load((REPO / "sweeps" / "ablation_recall.yaml").read_text())
    command = [c for c in spec["command"] if not c.startswith("hydra.run.dir=")]
    params = {"posenc": {"values": ["xl"]}, "model.mem_len": {"values": [16]}}
    out = here / "out"
    assert main([str(sweep_file(here, command=command, parameters=params)), "--out", str(out), *tiny()]) == 0
    (trial,) = state_of(out)["trials"]
    assert trial["run_dir"] == str(run_folder(out, trial["id"])) and (Path(trial["run_dir"]) / "results.json").is_file()
    assert trial["log"] == str(log_file(out, trial["id"]))
    assert (trial["state"], trial["status"], trial["attempts"]) == ("finished", "trained", 1)
    assert trial["wall_s"] > 0 and trial["cpu_s"] > 0 and trial["metric"] is not None
    assert trial["overrides"][:2] == ["posenc=xl", "model.mem_len=16"] and "model=tiny" in trial["overrides"]


@pytest.mark.slow  # a trained grid of every data-dependent scheme: about 30 s on 2 CPU cores
def test_a_grid_over_the_data_dependent_schemes_runs(here):
    """posenc=fox, stickbreaking and path in a sweep file, with no other edit: each trial trains its scheme with
    memory, two at a time; and a grid over p-RoPE's fraction and Llama 3.1's scaling composes point by point."""
    params = {"posenc": {"values": [FOX, STICKBREAKING, PATH]}, "model.mem_len": {"values": [16]}}
    out = here / "out"
    assert main([str(sweep_file(here, parameters=params)), "--out", str(out), "--jobs", "2", *tiny()]) == 0
    trials = state_of(out)["trials"]
    assert [t["state"] for t in trials] == ["finished"] * 3
    for t in trials:
        config = yaml.safe_load((Path(t["run_dir"]) / "config.yaml").read_text())
        assert config["posenc"]["name"] == t["params"]["posenc"] and config["model"]["mem_len"] == 16
        assert json.loads((Path(t["run_dir"]) / "results.json").read_text())["steps"] == 6
    rope = {"posenc": {"values": [ROPE]}, "posenc.partial": {"values": [0.25, 1.0]}}
    rope["posenc.scaling"] = {"values": ["none", "llama3"]}
    trials = check_sweep(sweep_file(here, name="rope.yaml", parameters=rope))
    assert {(t[1], t[2]) for t in trials} == {
        (f"posenc.partial={p}", f"posenc.scaling={s}") for p in (0.25, 1.0) for s in ("none", "llama3")
    }


def test_hyperband_stops_a_planted_bad_trial(here):
    """Two trials side by side (--jobs 2): a good learning rate and one too small to learn anything. Once both
    have validated three times hyperband (min_iter 2) finds the bad one behind, and it stops at its next
    validation (300 steps leave the runner seconds to see it)."""
    path = sweep_file(
        here,
        parameters={"optim.lr": {"values": [0.01, 1.0e-7]}},
        metric={"name": "val/loss", "goal": "minimize"},
        early_terminate={"type": "hyperband", "min_iter": 2},
    )
    out = here / "out"
    assert main([str(path), "--out", str(out), "--jobs", "2", *tiny(**{"trainer.max_steps": 300})]) == 0
    good, bad = state_of(out)["trials"]
    assert good["state"] == "finished" and good["steps"] == 300 and good["stopped_at"] is None
    assert bad["state"] == "stopped" and bad["params"] == {"optim.lr": 1.0e-7}
    assert 6 <= bad["stopped_at"] == bad["steps"] < 300
    assert min(v for _, v in bad["history"][:3]) > good["history"][2][1]
    results = json.loads((Path(bad["run_dir"]) / "results.json").read_text())  # it ended cleanly
    assert results["steps"] == bad["steps"] and (Path(bad["run_dir"]) / "checkpoints" / "last.ckpt").is_file()
    assert "| stopped |" in (out / "sweep.md").read_text()


# ---- slow: every sweep file, the signals, SLURM ------------------------------------------------------------

DATA = {"ablation": "pystdlib", "bayes_xl": "pystdlib", "ablation_recall": "recall", "shaw_k": "recall"}


@pytest.mark.slow
@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_every_sweep_file_runs_tiny_trials(here, path):
    """Each sweep file of sweeps/ as written, 2 trials (bayes: 3), tiny: the engine proposes, the trials run
    and finish (or hyperband stops one), the metric is read back. Bayes proposes from the fed-back metrics:
    its second proposal predicts the first trial's metric (the engine's one-sample case) and its third is what
    the engine proposes from the first two trials as recorded."""
    assert set(DATA) == {p.stem for p in SWEEPS}, "a new sweep file needs its corpus here"
    count = 3 if path.stem == "bayes_xl" else 2
    out = here / "out"
    spec = yaml.safe_load(path.read_text())
    overrides = [o for o in tiny(DATA[path.stem]) if o.split("=")[0] not in spec["parameters"]]
    assert main([str(path), "--out", str(out), "--count", str(count), *overrides]) == 0
    state = state_of(out)
    trials = state["trials"]
    assert len(trials) == count and all(t["state"] in ("finished", "stopped") for t in trials), trials
    for t in trials:
        assert set(t["params"]) == set(spec["parameters"]) and t["metric"] is not None
        assert t["run_dir"] == str(out / "runs" / "sweeps" / state["sweep_id"] / t["id"])
        assert json.loads((Path(t["run_dir"]) / "results.json").read_text())["steps"] == t["steps"]
    if spec["method"] == "grid":  # distinct grid points, in the engine's order
        assert trials[0]["params"] != trials[1]["params"]
    if spec["method"] == "bayes":
        assert trials[1]["search_info"]["predicted_value"] == pytest.approx(trials[0]["metric"])
        assert engine.propose(spec, trials[:2], state["seed"]) == (trials[2]["params"], trials[2]["search_info"])
    assert len((out / "sweep.csv").read_text().splitlines()) == count + 1


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.parametrize(
    "signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGKILL, -9)], ids=["TERM", "INT", "KILL"]
)
def test_a_signal_stops_the_sweep_cleanly_and_the_rerun_continues(here, signum, code):
    """SIGTERM or Ctrl-C while two trials train: each stops, saves its step, the state says interrupted, one line
    names what was kept and the command that continues; that command resumes both from their checkpoints.
    SIGKILL: the trials get SIGTERM as the runner dies (Linux), and the rerun resumes them the same way."""
    from posenc_lab.checkpoints import read_checkpoint

    path = sweep_file(here, parameters={"posenc": {"values": ["xl", "sinusoid"]}})
    out = here / "out"
    cmd = [sys.executable, "-m", "posenc_lab.cli", "sweep", str(path), "--out", str(out), "--jobs", "2"]
    cmd += tiny(**{"trainer.max_steps": 400, "checkpoint_every": 10000})
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))

    def both_validated() -> bool:
        runs = list((out / "runs" / "sweeps").glob("*/*/sweep_history.jsonl"))
        return len(runs) == 2 and all(len(p.read_text().splitlines()) >= 2 for p in runs)

    _wait_for(both_validated, 240, "two trials to validate twice")
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code, stdout[-2000:] + stderr[-3000:]
    trials = state_of(out)["trials"]
    if signum == signal.SIGKILL:  # no word from the runner; its trials stop by themselves and release their runs
        _wait_for(lambda: not any(Path(t["run_dir"], ".lock").exists() for t in trials), 120, "the trials to stop")
        assert [t["state"] for t in trials] == ["running", "running"]
    else:
        last = stdout.strip().splitlines()[-1]
        assert f"stopped ({signal.Signals(signum).name}); kept no trials; 2 interrupted trial(s) resume" in last
        assert f"continue with: posenc-lab sweep {path} --out {out} --jobs=2 model=tiny" in last
        assert [t["state"] for t in trials] == ["interrupted", "interrupted"]
    steps = {}
    for t in trials:
        ckpt = Path(t["run_dir"]) / "checkpoints" / "last.ckpt"  # saved at SIGTERM (checkpoint_every is 10000)
        steps[t["id"]] = read_checkpoint(ckpt)["global_step"]
        assert 4 <= steps[t["id"]] < 400 and not (Path(t["run_dir"]) / "results.json").exists()

    if signum != signal.SIGKILL:  # the command the runner printed is what continues it, run as printed
        printed = shlex.split(last.split("continue with: ", 1)[1])
        assert printed[0] == "posenc-lab"
        cmd = [sys.executable, "-m", "posenc_lab.cli", *printed[1:]]
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    trials = state_of(out)["trials"]
    assert [t["state"] for t in trials] == ["finished", "finished"] and len(trials) == 2
    assert all(t["status"] == "resumed" and t["attempts"] == 2 for t in trials)  # the grid's record of each
    for t in trials:
        results = json.loads((Path(t["run_dir"]) / "results.json").read_text())
        assert results["steps"] == 400 and results["resumed_from"].endswith("last.ckpt")
        assert t["history"][-1][0] == 400 and t["history"][0][0] == 2  # one history across both invocations


@pytest.mark.slow
def test_trials_run_as_slurm_jobs(here, slurm, monkeypatch):  # noqa: F811 - the fixture of tests/test_slurm.py
    """hydra/launcher=slurm: every trial is a one-job Hydra multirun submitted through submitit to a real
    one-node SLURM (tests/test_slurm.py starts it), the runner waiting on it; the metric comes back the same way
    and the run directory is the one the sweep file names."""
    out = here / "out"
    launcher = [
        "hydra/launcher=slurm",
        "hydra.launcher.partition=debug",
        "hydra.launcher.gpus_per_node=null",  # a CPU node
        "hydra.launcher.cpus_per_task=1",
        "hydra.launcher.timeout_min=10",
    ]
    for key in ("SLURM_CONF", "PATH"):  # the trials submit to this SLURM (sbatch passes the environment on)
        monkeypatch.setenv(key, slurm[key])
    path = REPO / "sweeps" / "ablation_recall.yaml"
    assert main([str(path), "--out", str(out), "--count", "2", "--jobs", "2", *launcher, *tiny()]) == 0
    state = state_of(out)
    assert [t["state"] for t in state["trials"]] == ["finished", "finished"]
    for t in state["trials"]:
        assert t["run_dir"] == str(out / "runs" / "sweeps" / state["sweep_id"] / t["id"])
        assert [s for s, _ in t["history"]] == [2, 4, 6] and t["metric"] is not None
        jobs = [p for p in (out / "launch" / t["id"] / ".submitit").iterdir() if p.is_dir()]
        assert len(jobs) == 1, jobs  # one SLURM job per trial, its log beside the sweep, not in the run dir
        assert "JobEnvironment(job_id=" in next(jobs[0].glob("*_log.out")).read_text()
        assert not (Path(t["run_dir"]) / ".submitit").exists()
