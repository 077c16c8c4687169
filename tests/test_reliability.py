"""Reliability (issue 23): every checkpoint save is a new file, whatever $TMPDIR is; a kill or a full disk
leaves the previous checkpoints; a stop signal saves, says how to continue and exits 143 / 130."""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import pytest
import torch

from posenc_lab.checkpoints import AtomicCheckpointIO, good_checkpoint, read_checkpoint
from posenc_lab.errors import Interrupted
from posenc_lab.io import DiskFullError
from posenc_lab.train import train
from tests.helpers_train import REPO, compose_config, record, recorded, run_module, subprocess_env, tiny


@pytest.fixture(autouse=True)
def no_stale_log_handlers():
    """Log handlers an earlier in-process Hydra command left on the root logger, writing to a stream pytest has
    closed since, would print "--- Logging error ---" tracebacks into this test's stderr: drop them."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(getattr(handler, "stream", None), "closed", False):
            root.removeHandler(handler)


def run_train(run_dir, cache, *extra, steps=4):
    return train(compose_config("train", tiny(run_dir, cache, *extra, steps=steps)))


def step_of(path) -> int:
    return int(read_checkpoint(path)["global_step"])


def partial_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob(".*.tmp*"))


def cli(main, argv, monkeypatch, capsys) -> tuple[int, str]:
    """Run a Hydra command's main() in this process as the console does: (exit status, stderr). The log
    handlers Hydra adds (a file in the run directory, which the test may remove) are taken off again."""
    from hydra.core.global_hydra import GlobalHydra

    root, handlers = logging.getLogger(), list(logging.getLogger().handlers)
    monkeypatch.setattr(sys, "argv", ["posenc-lab", *map(str, argv)])
    try:
        with pytest.raises(SystemExit) as info:
            main()
    finally:
        GlobalHydra.instance().clear()
        for handler in set(root.handlers) - set(handlers):
            handler.close()
        root.handlers[:] = handlers
    return info.value.code, capsys.readouterr().err


# ---- every save is a new file ---------------------------------------------------------------------


def test_good_checkpoints_keep_their_own_weights_when_tmpdir_is_another_file_system(tmp_path, cache, monkeypatch):
    """Lightning's save went through a temporary file in $TMPDIR; moved across file systems it was copied into
    the existing last.ckpt, the inode good.ckpt and good.prev.ckpt are hard links to: all three then held the
    newest weights. /dev/shm (a tmpfs) stands for a cluster's node-local $TMPDIR."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another file system than the test's temporary folder")
    elsewhere = Path(tempfile.mkdtemp(dir=shm, prefix="posenc-tmpdir-"))
    monkeypatch.setenv("TMPDIR", str(elsewhere))
    monkeypatch.setattr(tempfile, "tempdir", str(elsewhere))
    run = tmp_path / "run"
    try:
        run_train(run, cache, "checkpoint_every=1", steps=4)
        ckpts = run / "checkpoints"
        (ckpts / ".last.ckpt.x1y2.tmp.ckpt").write_bytes(b"half a checkpoint")  # a killed save's leftover
        run_train(run, cache, "checkpoint_every=1", steps=6)
        steps = {name: step_of(ckpts / name) for name in ("last.ckpt", "good.ckpt", "good.prev.ckpt")}
        assert steps == {"last.ckpt": 6, "good.ckpt": 5, "good.prev.ckpt": 4}
        inodes = {os.stat(ckpts / name).st_ino for name in steps}
        assert len(inodes) == 3
        assert [p for p in elsewhere.rglob("*") if p.is_file()] == []  # nothing written to $TMPDIR
        assert partial_files(run) == []  # the leftover was removed when the run started again
    finally:
        subprocess.run(["rm", "-rf", str(elsewhere)], check=False)


def test_a_failed_save_leaves_the_previous_checkpoint_and_no_temporary_file(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    target = tmp_path / "last.ckpt"
    io.save_checkpoint({"global_step": 1}, target)
    before = target.read_bytes()

    def full_disk(obj, f):
        f.write(b"x" * 1000)
        raise RuntimeError("PytorchStreamWriter failed writing file") from OSError(errno.ENOSPC, "No space left")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(DiskFullError, match=rf"no space left on the file system at .* to write {target}: it was not"):
        io.save_checkpoint({"global_step": 2}, target)
    assert target.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    monkeypatch.setattr(torch, "save", lambda obj, f: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):  # any interruption: the same
        io.save_checkpoint({"global_step": 2}, target)
    assert target.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


# ---- a full disk: one line, the previous checkpoints intact ------------------------------------------


def test_a_full_disk_under_a_library_writer_is_one_line_too(capsys):
    from posenc_lab.errors import reported

    with pytest.raises(SystemExit) as info, reported("train"):
        raise OSError(errno.ENOSPC, "No space left on device", "/runs/x/metrics.csv")  # a logger's write
    err = capsys.readouterr().err.splitlines()
    assert info.value.code == 1 and len(err) == 2
    assert err[0] == (
        "posenc-lab train: error: no space left on a disk (OSError: [Errno 28] No space left on device: "
        "'/runs/x/metrics.csv'); free space and rerun the same command"
    )
    with pytest.raises(OSError), reported("train"):  # any other OSError of a library stays a traceback
        raise OSError(errno.EIO, "Input/output error")


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MiB tmpfs mounted for the test (root only)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)], capture_output=True, text=True
    )
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path, leave: int) -> Path:
    """Take all free space of ``disk`` but ``leave`` bytes."""
    filler = disk / "filler"
    with open(filler, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize - leave)
    return filler


class FillDisk(L.Callback):
    """Fills the disk of ``path`` when training ends (before the final evaluation and results.json)."""

    def __init__(self, path: str):
        self.path = Path(path)

    def on_train_end(self, trainer, pl_module):
        fill(self.path, 0)


# save_top_k=-1 resumes into a checkpoints/ folder that holds files, which Lightning notes; intended here
@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")
def test_a_full_disk_leaves_the_previous_checkpoints_and_says_so_in_one_line(small_disk, cache, monkeypatch, capsys):
    from posenc_lab import train as train_module

    run = small_disk / "run"
    keep_all = ("checkpoint_every=2", "callbacks.checkpoint.save_top_k=-1")  # every save a new file: the disk fills
    run_train(run, cache, *keep_all, steps=4)
    last = (run / "checkpoints" / "last.ckpt").read_bytes()
    filler = fill(small_disk, 300_000)

    status, err = cli(train_module.main, tiny(run, cache, *keep_all, steps=8), monkeypatch, capsys)
    lines = err.strip().splitlines()
    assert status == 1 and "Traceback" not in err, err[-3000:]
    assert lines[-2].startswith(f"posenc-lab train: error: no space left on the file system at {small_disk} ")
    assert f"to write {run / 'checkpoints'}/step0000006.ckpt: it was not written" in lines[-2]
    assert (run / "checkpoints" / "last.ckpt").read_bytes() == last and step_of(good_checkpoint(run / "checkpoints"))
    assert all(step_of(p) <= 4 for p in (run / "checkpoints").glob("[!.]*.ckpt")) and partial_files(run) == []

    # results.json: the disk fills when training ends
    filler.unlink()
    fills = ["+callbacks.fill._target_=tests.test_reliability.FillDisk", f"+callbacks.fill.path={small_disk}"]
    status, err = cli(train_module.main, tiny(run, cache, *keep_all, *fills, steps=8), monkeypatch, capsys)
    assert status == 1 and "Traceback" not in err, err[-3000:]
    assert f"to write {run / 'results.json'}: it was not written" in err.strip().splitlines()[-2]
    assert step_of(run / "checkpoints" / "last.ckpt") == 8 and partial_files(run) == []
    assert '"steps": 4' in (run / "results.json").read_text()  # the previous one, whole

    (small_disk / "filler").unlink()
    assert run_train(run, cache, *keep_all, steps=8)["steps"] == 8  # space freed: the same command finishes


# ---- kill -9 at any moment of a save ----------------------------------------------------------------


@pytest.mark.slow
def test_kill_9_at_random_moments_of_saves_always_leaves_a_loadable_good_checkpoint(tmp_path):
    """A model of ~30 MB checkpoints saved at every step, killed again and again: half of the kills when a
    save's temporary file has appeared (mid-save), half at a random moment; $TMPDIR on a tmpfs."""
    shm = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="posenc-tmpdir-")) if Path("/dev/shm").is_dir() else tmp_path
    run, cache = tmp_path / "run", tmp_path / "cache"
    big = ("model.d_model=512", "model.d_inner=1024", "model.n_head=8", "model.mem_len=16", "checkpoint_every=1")
    args = [*tiny(run, cache, *big, steps=400), "trainer.val_check_interval=10000"]
    env = subprocess_env(TMPDIR=str(shm))
    rng = random.Random(0)
    kills = mid_saves = 0
    try:
        while kills < 8:
            proc = subprocess.Popen(
                [sys.executable, "-m", "posenc_lab.train", *args],
                cwd=REPO,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            mid_save = kills % 2 == 0
            deadline = time.monotonic() + (120 if mid_save else 8 + rng.uniform(0, 10))
            while time.monotonic() < deadline and proc.poll() is None:
                if mid_save and any((run / "checkpoints").glob(".*.tmp.ckpt")):
                    time.sleep(rng.uniform(0, 0.05))
                    mid_saves += 1
                    break
                time.sleep(0.005)
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            proc.kill()
            proc.wait()
            proc.stderr.close()
            kills += 1
            ckpts = run / "checkpoints"
            names = sorted(p.name for p in ckpts.glob("[!.]*.ckpt")) if ckpts.is_dir() else []
            for name in names:  # every checkpoint under its own name is whole
                read_checkpoint(ckpts / name)
            if "good.ckpt" in names or "good.prev.ckpt" in names:
                assert good_checkpoint(ckpts) is not None
            assert [p for p in shm.rglob("*") if p.is_file()] == []  # nothing in $TMPDIR
        assert mid_saves == 4 and good_checkpoint(run / "checkpoints") is not None
        done = run_module("posenc_lab.train", *args, timeout=900, TMPDIR=str(shm))
        assert done.returncode == 0, done.stderr[-3000:]
        assert json.loads((run / "results.json").read_text())["resumed_from"] == str(run / "checkpoints" / "last.ckpt")
        assert step_of(run / "checkpoints" / "last.ckpt") == 400 and partial_files(run) == []
    finally:
        if shm != tmp_path:
            subprocess.run(["rm", "-rf", str(shm)], check=False)


# ---- stop signals --------------------------------------------------------------------------------


class SignalAt(L.Callback):
    """Sends ``signum`` to this process during training step ``step`` (0-based global step)."""

    def __init__(self, step: int, signum: str):
        self.step, self.signum = int(step), getattr(signal, signum)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


def signal_at(step: int, signum: str = "SIGTERM") -> list[str]:
    return [
        "+callbacks.signal._target_=tests.test_reliability.SignalAt",
        f"+callbacks.signal.step={step}",
        f"+callbacks.signal.signum={signum}",
    ]


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


# ---- real signals from outside: one process, DDP ranks, a multirun --------------------------------------


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
