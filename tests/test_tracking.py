"""wandb's names, ids and summaries (posenc_lab/tracking.py), read back from the files wandb itself writes offline
(the run-ID.wandb transaction log of each ``offline-run-<time>-<id>`` folder): a run stopped by SIGTERM, or killed
with SIGKILL, and resumed stays one wandb run whose step count continues; runs are named and grouped
by their cell, seed and sweep; an uploaded report keeps one summary per run, two seeds of one cell apart."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from posenc_lab import tracking
from posenc_lab.io import CorruptFileError
from posenc_lab.rundir import RunDir
from posenc_lab.sweeps.command import merge_overrides, runner_overrides
from tests.helpers_train import REPO, compose_config, run_train, subprocess_env, tiny
from tests.schemes import XL
from tests.sweeps.helpers import read_wandb_records

STEPS = 6
WANDB = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}


def offline_runs(run_dir: Path, timeout: float = 60) -> list[dict]:
    """Each offline wandb folder under run_dir, oldest first: its folder id, the run record's id, name and group,
    the trainer/global_step of each logged row, and the summary as its updates leave it. A run this process has
    just finished may still be writing its log (wandb's own process writes it): read once it holds its exit record,
    or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        out = _read_offline_runs(run_dir)
        if all(p["exited"] for p in out) or time.monotonic() > deadline:
            return out
        time.sleep(0.2)


def _read_offline_runs(run_dir: Path) -> list[dict]:
    out = []
    for folder in sorted((run_dir / "wandb").glob("offline-run-*")):  # named offline-run-<YYYYmmdd_HHMMSS>-<id>
        (log,) = folder.glob("run-*.wandb")
        info: dict = {"folder_id": folder.name.rsplit("-", 1)[1], "steps": [], "summary": {}, "exited": False}
        for r in read_wandb_records(log):
            kind = r.WhichOneof("record_type")
            if kind == "run":
                info.update(run_id=r.run.run_id, name=r.run.display_name, group=r.run.run_group)
            elif kind == "history":
                row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
                if "trainer/global_step" in row:
                    info["steps"].append(row["trainer/global_step"])
            elif kind == "exit":
                info["exited"] = True
            elif kind == "summary":
                for item in r.summary.update:
                    info["summary"][item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        out.append(info)
    return out


def _stop(step: int, signum: str) -> list[str]:
    return ["+callbacks.signal._target_=tests.helpers_train.SignalAt", f"+callbacks.signal.step={step}",
            f"+callbacks.signal.signum={signum}"]  # fmt: skip


def _train(*args: str, **env: str) -> subprocess.Popen:
    """``posenc-lab train`` in a process of its own (wandb's state is per process, as in real use), offline."""
    return subprocess.Popen(
        [sys.executable, "-m", "posenc_lab.train", *args],
        cwd=REPO,
        env=subprocess_env(**WANDB, **env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _ended(proc: subprocess.Popen, returncode: int) -> None:
    err = proc.communicate(timeout=300)[1]
    assert proc.returncode == returncode, err[-3000:]


@pytest.fixture(scope="module")
def wandb_runs(tmp_path_factory, cache):
    """Two runs of the cell recall/xl:mem16 with logger=wandb, offline: seed 0 stopped by SIGTERM during step 2 and
    resumed to the end; seed 1, meanwhile, as the trial of a sweep. Returns (their run dirs, seed 0's overrides)."""
    root = tmp_path_factory.mktemp("tracking")
    a, b = root / "seed0", root / "sweep" / "trial0001"
    train = [*tiny(a, cache, f"posenc={XL}", "logger=wandb", "checkpoint_every=1", steps=STEPS), "seed=0"]
    trial = runner_overrides(b, "val/loss", b / "history.jsonl", root / "stop", "mysweep")
    sweep = {"WANDB_SWEEP_ID": "sweep123", "WANDB_RUN_ID": "trial0001"}
    b_args = merge_overrides([*tiny(b, cache, f"posenc={XL}", "logger=wandb"), "seed=1"], trial)
    procs = [(_train(*train, *_stop(2, "SIGTERM")), 143), (_train(*b_args, **sweep), 0)]
    for proc, returncode in procs:
        _ended(proc, returncode)
    _ended(_train(*train), 0)
    return (a, b), train


def test_a_resumed_run_continues_its_wandb_run(wandb_runs):
    """The two invocations of seed 0 (stopped by SIGTERM, then to the end) wrote one wandb run: the id the run
    directory recorded when it first started, in both folders' names (offline-run-<time>-<id>: `wandb sync` uploads
    them as one run) and run records; the resumed part continues the step count (trainer/global_step, the x axis
    of the charts) from the step the stop saved, 3, up to the last step."""
    (a, _), _ = wandb_runs
    parts = offline_runs(a)
    run_id = RunDir(a).wandb_id()
    assert len(parts) == 2 and run_id
    assert {p["folder_id"] for p in parts} == {p["run_id"] for p in parts} == {run_id}
    assert parts[0]["steps"] == [0, 1, 2] and parts[1]["steps"][0] == 3 and parts[1]["steps"][-1] == STEPS
    assert json.loads((a / "results.json").read_text())["steps"] == STEPS


def test_a_run_killed_and_extended_stays_one_wandb_run(wandb_runs, tmp_path):
    """kill -9 during step 8 of an extension of the finished run (trainer.max_steps 6 -> 10), then the rest: the
    same wandb run id in every folder, and the last part continues from the newest checkpoint, step 8. (wandb
    keeps nothing of the killed part's log: its own process dies before it writes; the folder still has the id.)"""
    (a, _), train = wandb_runs
    run = tmp_path / "run"
    shutil.copytree(a, run, symlinks=True)
    longer = [o.replace(str(a), str(run)) for o in train] + ["trainer.max_steps=10"]
    _ended(_train(*longer, *_stop(8, "SIGKILL")), -signal.SIGKILL)
    _ended(_train(*longer), 0)
    parts = offline_runs(run, timeout=0)  # the killed part never writes its exit
    assert len(parts) == 4 and {p["folder_id"] for p in parts} == {RunDir(a).wandb_id()}
    assert parts[-1]["run_id"] == RunDir(a).wandb_id() and parts[-1]["steps"][0] == 8
    assert parts[-1]["steps"][-1] == 10


def test_names_and_groups_say_the_cell_the_seed_and_the_sweep(wandb_runs):
    (a, b), _ = wandb_runs
    (trial,) = offline_runs(b)
    assert {(p["name"], p["group"]) for p in offline_runs(a)} == {(f"recall/{XL}:mem16 seed0", f"recall/{XL}:mem16")}
    assert trial["name"] == f"recall/{XL}:mem16 seed1 mysweep/trial0001"
    assert trial["group"] == f"sweep-sweep123/recall/{XL}:mem16"
    assert trial["run_id"] == trial["folder_id"] == RunDir(b).wandb_id() == "trial0001"  # the agent's id


def test_the_name_says_a_recent_loss_and_a_set_name_or_group_wins(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_SWEEP_ID", raising=False)
    cfg = compose_config("train", [f"posenc={XL}", "model.mem_len=32", "model.loss_recent_frac=0.5", "seed=3"])
    assert tracking.run_name(cfg) == f"pystdlib/{XL}:mem32:half seed3"
    assert tracking.run_group(cfg) == f"pystdlib/{XL}:mem32:half"
    ssmax = compose_config("train", [f"posenc={XL}", "model.mem_len=32", "model.softmax_scale=ssmax", "seed=3"])
    assert tracking.run_name(ssmax) == f"pystdlib/{XL}+ssmax:mem32 seed3"  # another cell than xl's
    cfg = compose_config("train", ["logger=wandb", "logger.group=mine", "model.mem_len=0"])
    options = tracking.logger_options(cfg, RunDir(tmp_path))
    assert "group" not in options and options["name"].endswith(":nomem seed0") and len(options["id"]) == 8


def test_a_damaged_wandb_id_is_named_before_anything_loads(tmp_path, cache):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / RunDir.WANDB_ID).write_text("not an id!\n")
    with pytest.raises(CorruptFileError, match=f"{RunDir.WANDB_ID} holds no wandb run id .*delete it") as info:
        run_train(tmp_path / "run", cache, "logger=wandb")
    assert "\n" not in str(info.value) and sorted(p.name for p in (tmp_path / "run").iterdir()) == [RunDir.WANDB_ID]


def test_two_seeds_of_one_cell_leave_two_summaries(wandb_runs, tmp_path, monkeypatch):
    """The report's upload keys each run's figures by its cell and seed: both seeds of recall/xl:mem16 stay in the
    summary wandb wrote, each with its own run's figure."""
    from posenc_lab_analysis.wandb_upload import upload

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_SWEEP_ID", raising=False)
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    report = tmp_path / "report"
    report.mkdir()
    (report / "table.csv").write_text("scheme,x\nxl,1\n")
    runs = list(wandb_runs[0])
    upload(report, runs, project="posenc-lab-test", group="g", wandb_dir=str(tmp_path))
    (uploaded,) = offline_runs(tmp_path)
    for seed, run in enumerate(runs):
        loss = json.loads((run / "results.json").read_text())["test"]["loss"]
        key = tracking.summary_key(f"recall/{XL}:mem16", seed, "test_loss")
        assert uploaded["summary"].get(key) == loss, (key, sorted(k for k in uploaded["summary"] if "test_loss" in k))
    assert not [k for k in uploaded["summary"] if k.startswith(f"runs/{XL}/")]


def test_runs_in_one_process_each_log_to_their_own_wandb_run(tmp_path, cache, monkeypatch):
    """Two runs in one process (a Hydra multirun's jobs): the second gets its own wandb run, not the first's, which
    Lightning's WandbLogger leaves open (train.py finishes it)."""
    for key, value in WANDB.items():
        monkeypatch.setenv(key, value)
    for var in ("WANDB_SWEEP_ID", "WANDB_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    for seed in (0, 1):
        run_train(tmp_path / f"s{seed}", cache, f"posenc={XL}", "logger=wandb", f"seed={seed}", steps=2)
    parts = [offline_runs(tmp_path / f"s{seed}") for seed in (0, 1)]
    assert [len(p) for p in parts] == [1, 1] and parts[0][0]["run_id"] != parts[1][0]["run_id"]
    assert [p[0]["name"] for p in parts] == [f"recall/{XL}:mem16 seed0", f"recall/{XL}:mem16 seed1"]
    assert parts[1][0]["steps"] == [0, 1, 2, 2]  # its own steps only


def test_two_runs_of_one_cell_and_seed_are_refused_before_any_upload(wandb_runs, tmp_path, capsys):
    """Their figures would take one summary key: the upload names both in one line, and wandb starts no run."""
    from posenc_lab_analysis.wandb_upload import main

    (a, _), _ = wandb_runs
    again = shutil.copytree(a, tmp_path / "again", symlinks=True)
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "table.csv").write_text("scheme,x\nxl,1\n")
    before = set(Path.cwd().glob("wandb/*run-*"))  # where wandb would write (no --wandb-dir)
    assert main([str(tmp_path / "report"), "--runs", str(a), str(again)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"cell 'recall/{XL}:mem16' holds runs with the same seed" in err and str(again) in err
    assert set(Path.cwd().glob("wandb/*run-*")) == before
