"""Training's stop signals (posenc_lab/train.py): a signal saves at the end of the step,
prints one line with the command that continues, and exits 143 / 130; DDP and multiruns stop as one."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from posenc_lab.checkpoints import read_checkpoint
from posenc_lab.errors import Interrupted
from tests.helpers_train import (
    REPO,
    cli,
    no_stale_log_handlers,  # noqa: F401 - an autouse fixture
    record,
    recorded,
    run_module,
    run_train,
    signal_at,
    step_of,
    subprocess_env,
    tiny,
)


def test_a_stop_signal_saves_at_the_end_of_the_step_and_the_run_resumes_exactly(tmp_path, cache):
    """SIGTERM during step 3: the step ends, last.ckpt holds it, Interrupted names it; the rerun gives the
    losses of a run never stopped (dropout on, memory across the cut, a validation in between)."""
    common = ("model.dropout=0.1", "checkpoint_every=100", "trainer.val_check_interval=2")
    full = run_train(tmp_path / "full", cache, *common, *record(tmp_path / "rec_full"), steps=7)
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as info:
        run_train(tmp_path / "run", cache, *common, *signal_at(2), steps=7)
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert info.value.signum == signal.SIGTERM and info.value.saved == str(last)
    assert str(info.value) == f"stopped by SIGTERM at step 3; saved {last}"
    assert step_of(last) == 3 and signal.getsignal(signal.SIGTERM) == previous  # handlers put back
    resumed = run_train(tmp_path / "run", cache, *common, *record(tmp_path / "rec_resumed"), steps=7)
    before, after = recorded(tmp_path / "rec_full"), recorded(tmp_path / "rec_resumed")
    assert [s["step"] for s in after] == [4, 5, 6, 7]
    for a, b in zip(before[3:], after):
        assert a["tokens"] == b["tokens"] and a["loss"] == pytest.approx(b["loss"], abs=1e-6, rel=0)
    assert resumed["val"]["loss"] == pytest.approx(full["val"]["loss"], abs=1e-6)
    assert [(s["from_step"], s["to_step"]) for s in resumed["schedule"]] == [(0, 3), (3, 7)]


@pytest.mark.parametrize("signum, status", [("SIGTERM", 143), ("SIGINT", 130), ("SIGHUP", 129)])
def test_train_stopped_by_a_signal_prints_one_line_and_exits_non_zero(
    tmp_path, cache, signum, status, monkeypatch, capsys
):
    from posenc_lab import train as train_module

    run = tmp_path / "run"
    code, err = cli(train_module.main, tiny(run, cache, *signal_at(1, signum), steps=50), monkeypatch, capsys)
    lines = [line for line in err.splitlines() if line.startswith("posenc-lab train:")]
    assert code == status and "Traceback" not in err and len(lines) == 1, err[-3000:]
    assert lines[0].startswith(f"posenc-lab train: stopped by {signum} at step 2; saved {run}/checkpoints/last.ckpt. ")
    same = shlex.join([*tiny(run, cache, *signal_at(1, signum), steps=50)[1:]])  # the overrides but run_dir
    assert lines[0].endswith(f". Continue with: posenc-lab train {same} run_dir={run}")
    assert step_of(run / "checkpoints" / "last.ckpt") == 2


def test_a_signal_before_training_stops_at_once_and_leaves_no_new_run_dir(tmp_path, cache, monkeypatch, capsys):
    from posenc_lab import train as train_module

    def interrupted_check(datamodule):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(train_module, "check_splits", interrupted_check)
    run = tmp_path / "run"
    code, err = cli(train_module.main, tiny(run, cache), monkeypatch, capsys)
    assert code == 143 and "Traceback" not in err
    assert "posenc-lab train: stopped by SIGTERM; newest checkpoint: none yet. Continue with: posenc-lab train " in err
    assert not run.exists()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def _start(args, **env) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "posenc_lab.train", *map(str, args)],
        cwd=REPO,
        env=subprocess_env(**env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_training(checkpoint: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    """Until training runs (a first checkpoint is there), then 1 s more."""
    deadline = time.monotonic() + timeout
    while not checkpoint.is_file():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
        time.sleep(0.2)
    time.sleep(1)


def _stopped(proc: subprocess.Popen, signum) -> tuple[str, int, str]:
    """Send ``signum``; (the one stop line, the step it names, stderr)."""
    proc.send_signal(signum)
    err = proc.communicate(timeout=300)[1]
    lines = [line for line in err.splitlines() if line.startswith("posenc-lab train:")]
    assert proc.returncode == 128 + signum and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0], int(lines[0].split(" at step ")[1].split(";")[0]), err


@pytest.mark.slow
def test_sigterm_from_outside_saves_and_the_printed_command_continues_the_run(tmp_path):
    run = tmp_path / "run"
    proc = _start(tiny(run, tmp_path / "cache", "checkpoint_every=5", steps=100000))
    _wait_for_training(run / "checkpoints" / "last.ckpt", proc)
    line, step, _ = _stopped(proc, signal.SIGTERM)
    assert line.startswith(f"posenc-lab train: stopped by SIGTERM at step {step}; saved {run}/checkpoints/last.ckpt.")
    assert step > 0 and step_of(run / "checkpoints" / "last.ckpt") == step
    command = shlex.split(line.split(". Continue with: ")[1])
    assert command[:2] == ["posenc-lab", "train"] and f"run_dir={run}" in command
    command = [a if a != "trainer.max_steps=100000" else f"trainer.max_steps={step + 3}" for a in command]
    done = subprocess.run(
        [sys.executable, "-m", "posenc_lab.cli", *command[1:]],
        cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((run / "results.json").read_text())
    assert results["steps"] == step + 3 and results["resumed_from"] == str(run / "checkpoints" / "last.ckpt")


@pytest.mark.slow
def test_sigterm_to_a_ddp_run_stops_every_rank_at_one_step_with_one_checkpoint_and_one_line(tmp_path):
    run, cache = tmp_path / "run", tmp_path / "cache"
    ddp = ("trainer=ddp_cpu", "trainer.devices=2", "checkpoint_every=5")
    args = [a for a in tiny(run, cache, *ddp, steps=100000) if not a.startswith("run_dir=")]
    proc = _start([*args, f"hydra.run.dir={run}"])  # as test_ddp.py: rank 1 is Lightning's re-launch of this
    _wait_for_training(run / "checkpoints" / "last.ckpt", proc)
    _, step, err = _stopped(proc, signal.SIGTERM)  # to rank 0 only: it tells rank 1 at the end of the step
    ckpt = read_checkpoint(run / "checkpoints" / "last.ckpt")
    assert ckpt["global_step"] == step and ckpt["posenc_lab"]["train_mems"][0].shape[0] == 4  # both ranks' streams
    again = run_module("posenc_lab.train", *[a.replace("=100000", f"={step + 2}") for a in args],
                       f"hydra.run.dir={run}", timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((run / "results.json").read_text())["steps"] == step + 2


@pytest.mark.slow
def test_sigterm_to_a_multirun_stops_the_sweep_and_names_the_job_to_continue(tmp_path):
    sweep = tmp_path / "sweep"
    proc = _start(["-m", "seed=0,1", *tiny(sweep, tmp_path / "cache", "checkpoint_every=5", steps=100000)])
    job = sweep / "0_xl_recall"
    _wait_for_training(job / "checkpoints" / "last.ckpt", proc)
    line, step, _ = _stopped(proc, signal.SIGTERM)
    assert step_of(job / "checkpoints" / "last.ckpt") == step
    assert "seed=0" in line and line.endswith(f"run_dir={job}") and "-m" not in shlex.split(line)
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0_xl_recall"]  # the next job never started
