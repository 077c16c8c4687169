"""Checkpoints (posenc_lab/checkpoints.py): read as data only, every save a new file
renamed into place (a kill or a full disk leaves the previous ones), the newest two good ones kept.

No step lost on resume: last.ckpt is the newest state whatever checkpoint_every was, the two good
checkpoints are two files after any sequence of resumes, and a stop logs the metrics of the step it stopped at."""

from __future__ import annotations

import csv
import errno
import json
import logging
import math
import os
import pickle
import random
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch

from posenc_lab.checkpoints import (
    SANE_LOSS_RATIO,
    SANE_WEIGHT_ABS,
    AtomicCheckpointIO,
    CheckpointError,
    Checkpointing,
    good_checkpoint,
    read_checkpoint,
)
from posenc_lab.errors import Interrupted
from posenc_lab.evaluate import evaluate_checkpoint
from posenc_lab.io import DiskFullError, atomic_path
from posenc_lab.lit import NonFiniteLossError
from tests.helpers_train import (  # noqa: F401 - autouse fixture
    REPO,
    cli,
    compose_config,
    no_stale_log_handlers,
    run_module,
    run_train,
    signal_at,
    step_of,
    subprocess_env,
    tiny,
)


def _checkpoints(run: Path) -> dict[str, Path]:
    return {p.name: p for p in (run / "checkpoints").glob("[!.]*.ckpt")}


def test_changing_checkpoint_every_on_extensions_keeps_last_ckpt_the_newest_state(tmp_path, cache):
    """Lightning kept the callback's state under a key naming the save interval: with another checkpoint_every it
    did not know last.ckpt as its own and saved last-v1.ckpt beside it; the next extension resumed the stale one."""
    run = tmp_path / "run"
    run_train(run, cache, "checkpoint_every=7", steps=12)
    extended = run_train(run, cache, "checkpoint_every=5", steps=20)
    assert sorted(_checkpoints(run)) == ["good.ckpt", "good.prev.ckpt", "last.ckpt"]
    assert step_of(run / "checkpoints" / "last.ckpt") == 20 and extended["steps"] == 20
    again = run_train(run, cache, "checkpoint_every=3", steps=25)
    assert sorted(_checkpoints(run)) == ["good.ckpt", "good.prev.ckpt", "last.ckpt"]
    assert step_of(run / "checkpoints" / "last.ckpt") == 25
    results = json.loads((run / "results.json").read_text())
    assert results["steps"] == again["steps"] == 25 and results["checkpoint"] == str(run / "checkpoints" / "last.ckpt")
    assert results["resumed_from"] == str(run / "checkpoints" / "last.ckpt")
    assert [(s["from_step"], s["to_step"]) for s in results["schedule"]] == [(0, 12), (12, 20), (20, 25)]


def test_a_checkpoint_of_an_earlier_version_resumes_with_its_state_under_todays_key(tmp_path, cache):
    """Checkpoints written before the fix keep the callback's state under Lightning's key, which names the save
    interval: it is read under today's key (no warning that a callback is missing, no last-v1.ckpt)."""
    run = tmp_path / "run"
    run_train(run, cache, "checkpoint_every=2", steps=4)
    last = run / "checkpoints" / "last.ckpt"
    ckpt = torch.load(last, weights_only=True)
    (key,) = [k for k in ckpt["callbacks"] if k.startswith("Checkpointing")]
    old = "Checkpointing{'monitor': None, 'mode': 'min', 'every_n_train_steps': 2, 'every_n_epochs': 0, " + (
        "'train_time_interval': None}"
    )
    ckpt["callbacks"] = {old: ckpt["callbacks"].pop(key)}
    torch.save(ckpt, last)
    moved = Checkpointing.adopt_state({"callbacks": {old: {"x": 1}}})
    assert moved == {"callbacks": {Checkpointing(dirpath=tmp_path).state_key: {"x": 1}}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_train(run, cache, "checkpoint_every=3", steps=7)
    assert [str(w.message) for w in caught if "callbacks used to create the checkpoint" in str(w.message)] == []
    assert sorted(_checkpoints(run)) == ["good.ckpt", "good.prev.ckpt", "last.ckpt"] and step_of(last) == 7


# ---- the good checkpoints -------------------------------------------------------------------------------------


class CrashAt(L.Callback):
    """Raises at the start of training step ``step`` (0-based global step): a crash after some steps."""

    def __init__(self, step: int):
        self.step = int(step)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            raise RuntimeError(f"crash at step {self.step}")


def crash_at(step: int) -> list[str]:
    return ["+callbacks.crash._target_=tests.test_checkpoints.CrashAt", f"+callbacks.crash.step={step}"]


def _good(run: Path) -> tuple[int, int]:
    """(step of good.ckpt, step of good.prev.ckpt), after checking that they are two files."""
    ckpts = run / "checkpoints"
    good, prev = ckpts / "good.ckpt", ckpts / "good.prev.ckpt"
    assert os.stat(good).st_ino != os.stat(prev).st_ino and os.stat(prev).st_nlink == 1
    return step_of(good), step_of(prev)


def _resume(run, cache, *extra, steps):
    try:
        run_train(run, cache, *extra, steps=steps)
    except RuntimeError as e:
        assert str(e).startswith("crash at step"), e


@pytest.mark.parametrize(
    "sequence",
    [
        # (checkpoint_every, steps, crash at step or None) for every command after the first
        [(100, 8, 5), (100, 8, 5), (100, 8, None)],  # resumed from a good last.ckpt, crashed before the next save
        [(1, 8, 6), (100, 8, 5), (2, 10, None)],
        [(100, 6, None), (100, 8, 7), (1, 10, None)],
    ],
    ids=["crash-twice-after-resume", "mixed-intervals", "extend-then-crash"],
)
def test_the_good_checkpoints_are_two_files_and_good_prev_the_older_after_any_sequence_of_resumes(
    tmp_path, cache, sequence
):
    """Resuming from a last.ckpt that was already good.ckpt made it the candidate again: confirmed, good.ckpt moved
    to good.prev.ckpt and the candidate (the same file) to good.ckpt: one file under three names, the older good
    checkpoint deleted."""
    run = tmp_path / "run"
    run_train(run, cache, "checkpoint_every=1", steps=4)  # good 3, prev 2
    assert _good(run) == (3, 2)
    history = [_good(run)]
    for every, steps, crash in sequence:
        _resume(run, cache, f"checkpoint_every={every}", *(crash_at(crash) if crash is not None else ()), steps=steps)
        good, prev = _good(run)
        assert prev < good and good >= history[-1][0], (history, (good, prev))
        history.append((good, prev))


# ---- the stopping step's metrics ------------------------------------------------------------------------------


def _train_loss_steps(run: Path) -> list[int]:
    with open(run / "metrics.csv", newline="") as f:
        return [int(row["step"]) for row in csv.DictReader(f) if row.get("train/loss")]


@pytest.mark.parametrize("log_every", [1, 10])
def test_a_stop_logs_the_metrics_of_the_step_it_stopped_at(tmp_path, cache, log_every):
    """The stop was raised inside the step's end hooks, before Lightning logged the step: metrics.csv had no row for
    it. The logger's step is Lightning's 0-based step index: the step that ends at global step 3 is row 2."""
    run = tmp_path / "run"
    with pytest.raises(Interrupted) as info:
        run_train(run, cache, *signal_at(2), f"trainer.log_every_n_steps={log_every}", steps=20)
    assert str(info.value).startswith("stopped by SIGTERM at step 3; saved ")
    logged = _train_loss_steps(run)
    assert logged[-1] == 2 and logged == ([0, 1, 2] if log_every == 1 else [2])


def test_a_run_left_with_a_newer_last_v1_ckpt_resumes_from_it(tmp_path):
    """A run directory of a version before the fix: last.ckpt stale, the newest state in last-v1.ckpt."""
    from posenc_lab.rundir import RunDir

    ckpts = tmp_path / "run" / "checkpoints"
    ckpts.mkdir(parents=True)
    for i, name in enumerate(("last-v2.ckpt", "last.ckpt", "last-v1.ckpt")):
        (ckpts / name).write_bytes(b"x")
        os.utime(ckpts / name, ns=(10**18 + i * 10**9, 10**18 + i * 10**9))
    assert RunDir(tmp_path / "run").newest_checkpoint() == ckpts / "last-v1.ckpt"
    (ckpts / "last-v1.ckpt").unlink()
    (ckpts / "last-v2.ckpt").unlink()
    assert RunDir(tmp_path / "run").newest_checkpoint() == ckpts / "last.ckpt"


# The recall probe, tiny model: at lr 30 (warm-up over 200 steps, so the first updates are small) the loss climbs to
# 10-200 nats without reaching inf or NaN; the checkpoint of step 3 is the last one the step after it confirms.
DIVERGES = ("optim.lr=30", "optim.warmup_steps=200", "checkpoint_every=1")


def test_a_run_that_diverges_to_a_finite_loss_says_its_final_checkpoint_is_unhealthy(tmp_path, cache, finished, caplog):
    """It exited 0 with no word. Now one warning line names last.ckpt and good.ckpt with their losses, results.json
    records health; train returns (exit 0, see train.py: a sweep ranks the trial, an ablation reaches its report)."""
    run = tmp_path / "diverged"
    with caplog.at_level(logging.WARNING, logger="posenc_lab"):
        run_train(run, cache, *DIVERGES, steps=10)
    lines = [r.getMessage() for r in caplog.records if "is not healthy" in r.getMessage()]
    assert len(lines) == 1 and len(lines[0].splitlines()) == 1, caplog.text
    health = json.loads((run / "results.json").read_text())["health"]
    last, good = run / "checkpoints" / "last.ckpt", run / "checkpoints" / "good.ckpt"
    vocab = read_checkpoint(last)["hyper_parameters"]["model"]["vocab_size"]
    assert health["ok"] is False and health["checkpoint"] == str(last) and health["step"] == step_of(last) == 10
    assert health["loss_limit"] == pytest.approx(SANE_LOSS_RATIO * math.log(vocab))
    for loss in ("val_loss", "train_loss"):
        assert math.isfinite(health[loss]) and health[loss] > health["loss_limit"], health
    assert health["good"]["checkpoint"] == str(good) and health["good"]["step"] == step_of(good) < 10
    assert health["good"]["loss"] <= health["loss_limit"]  # the loss that confirmed it
    line = lines[0]
    assert f"{last} (step 10) is not healthy" in line and f"val loss {health['val_loss']:.5g}" in line
    assert f"last training step's loss {health['train_loss']:.5g} nats exceed" in line
    assert (
        f"good.ckpt (step {step_of(good)}, loss {health['good']['loss']:.5g} nats" in line and f"resume={good}" in line
    )
    # good.ckpt's record travels in the checkpoints (a resumed run names it too)
    states = read_checkpoint(last)["callbacks"]
    assert [s["good"]["step"] for k, s in states.items() if k.startswith("Checkpointing")] == [step_of(good)]

    # Without a confirmed checkpoint (none saved before the divergence) the line says none was kept.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="posenc_lab"):
        run_train(tmp_path / "no-good", cache, *DIVERGES, "checkpoint_every=100", steps=10)
    (line,) = [r.getMessage() for r in caplog.records if "is not healthy" in r.getMessage()]
    assert "no healthy checkpoint was kept (a lower checkpoint_every keeps more)" in line, line
    assert json.loads((tmp_path / "no-good" / "results.json").read_text())["health"]["good"] is None

    # A healthy run says nothing and records ok.
    healthy = json.loads((finished / "results.json").read_text())["health"]
    assert healthy["ok"] is True and healthy["val_loss"] <= healthy["loss_limit"] and healthy["good"]["step"] == 2


class _WritesMarker:
    """Unpickling this object creates the marker file (a stand-in for any code a file could run)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


# The crafted plain pickle uses protocol 4; torch's weights-only unpickler warns about the protocol before
# it refuses the file, which is the refusal under test.
@pytest.mark.filterwarnings("ignore:Detected pickle protocol:UserWarning")
@pytest.mark.parametrize("fmt", ["torch.save", "plain pickle"])
def test_a_checkpoint_that_would_run_code_is_refused_before_it_runs(tmp_path, fmt, finished):
    marker = tmp_path / "MARKER"
    crafted = tmp_path / "crafted.ckpt"
    real = read_checkpoint(finished / "checkpoints" / "last.ckpt")
    real["hyper_parameters"] = {**real["hyper_parameters"], "payload": _WritesMarker(marker)}
    if fmt == "torch.save":
        torch.save(real, crafted)
    else:
        crafted.write_bytes(pickle.dumps(real))
    for load in (read_checkpoint, evaluate_checkpoint):
        with pytest.raises(CheckpointError, match=r"crafted\.ckpt is refused.*Nothing in it was run"):
            load(crafted)
    with pytest.raises(CheckpointError, match="crafted.ckpt is refused"):
        run_train(tmp_path / "resumed", tmp_path / "cache", f"resume={crafted}")
    assert not marker.exists()
    assert not (tmp_path / "resumed").exists()  # refused before anything was written
    # The project's own checkpoints load as data only.
    assert read_checkpoint(finished / "checkpoints" / "last.ckpt")["global_step"] == 4


# The recovery run saves checkpoints on another schedule than the diverged run that wrote the checkpoint;
# Lightning notes that the callback differs, which is intended here.
@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`")
def test_after_a_divergence_the_named_checkpoint_resumes_and_trains_finitely(tmp_path, cache, finished):
    """The issue's case, optim.lr=1e3: every update blows the weights up. A fresh run names no checkpoint
    as good (none is); continuing a sane run at that lr names a checkpoint that resumes with a sane lr."""
    with pytest.raises(NonFiniteLossError, match="No good checkpoint was saved before it"):
        run_train(tmp_path / "fresh", cache, "optim.lr=1e3", "checkpoint_every=1", steps=40)

    start = finished / "checkpoints" / "last.ckpt"  # its schedule ends at step 4: a new one to step 40
    with pytest.raises(NonFiniteLossError) as info:
        diverge = ("optim.lr=1e3", "optim.total_steps=40", "checkpoint_every=1")
        run_train(tmp_path / "diverged", cache, f"resume={start}", *diverge, steps=40)
    message = str(info.value)
    assert "Last good checkpoint: " in message and "resume=" in message
    named = message.split("Last good checkpoint: ")[1].split(" ")[0]
    ckpt = read_checkpoint(named)
    health = ckpt["posenc_lab"]["health"]
    assert health["ok"] and health["max_abs_weight"] <= SANE_WEIGHT_ABS
    last = read_checkpoint(tmp_path / "diverged" / "checkpoints" / "last.ckpt")
    assert last["global_step"] > ckpt["global_step"]  # the diverged state is not the one named

    steps = ckpt["global_step"] + 4
    results = run_train(tmp_path / "recovered", cache, f"resume={named}", "optim.lr=1e-3", steps=steps)
    assert results["steps"] == steps
    vocab = ckpt["hyper_parameters"]["model"]["vocab_size"]
    assert math.isfinite(results["val"]["loss"]) and results["val"]["loss"] < SANE_LOSS_RATIO * math.log(vocab)
    resumed = read_checkpoint(tmp_path / "recovered" / "checkpoints" / "last.ckpt")
    assert resumed["optimizer_states"][0]["param_groups"][0]["initial_lr"] == pytest.approx(1e-3)


def partial_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob(".*.tmp*"))


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


@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")
def test_a_full_disk_at_last_ckpt_after_the_periodic_one_leaves_last_ckpt_naming_it(tmp_path, cache, monkeypatch):
    """save_top_k=-1 saves a periodic checkpoint, then last.ckpt: when only the second fails, last.ckpt names the
    first (the same step) and no candidate is left; without root (``small_disk``) the full disk is simulated."""
    save = AtomicCheckpointIO.save_checkpoint

    def full_at_last(self, checkpoint, path, storage_options=None):
        if Path(path).name == "last.ckpt" and checkpoint["global_step"] == 2:
            with atomic_path(path) as tmp:
                tmp.write_bytes(b"half a checkpoint")
                raise OSError(errno.ENOSPC, "No space left on device")
        return save(self, checkpoint, path, storage_options)

    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", full_at_last)
    run, keep_all = tmp_path / "run", ("checkpoint_every=2", "callbacks.checkpoint.save_top_k=-1")
    ckpts = run / "checkpoints"
    with pytest.raises(DiskFullError, match=rf"; last\.ckpt now names {ckpts}/step0000002\.ckpt, saved at this step$"):
        run_train(run, cache, *keep_all, steps=4)
    assert sorted(p.name for p in ckpts.iterdir()) == ["last.ckpt", "step0000002.ckpt"]  # no candidate, no tmp
    assert os.path.samefile(ckpts / "last.ckpt", ckpts / "step0000002.ckpt") and step_of(ckpts / "last.ckpt") == 2
    monkeypatch.undo()
    again = run_train(run, cache, *keep_all, steps=4)
    assert again["resumed_from"] == str(ckpts / "last.ckpt") and again["schedule"][-1]["from_step"] == 2
    assert again["steps"] == 4 and not list(ckpts.glob(".*"))


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

    # last.ckpt: the disk fills between this step's periodic checkpoint and last.ckpt. last.ckpt names the periodic
    # one (it was left without a last.ckpt and with a stray .candidate.ckpt), and the run continues from it.
    filler.unlink()
    ckpts = run / "checkpoints"
    filler = fill(small_disk, (ckpts / "last.ckpt").stat().st_size * 3 // 2)  # room for one checkpoint, not two
    status, err = cli(train_module.main, tiny(run, cache, *keep_all, steps=8), monkeypatch, capsys)
    line = err.strip().splitlines()[-2]
    assert status == 1 and "Traceback" not in err, err[-3000:]
    assert f"to write {ckpts}/last.ckpt: it was not written" in line
    assert line.endswith(f"; last.ckpt now names {ckpts}/step0000006.ckpt, saved at this step"), line
    assert sorted(p.name for p in ckpts.glob(".*")) == [] and partial_files(run) == []  # no candidate, no tmp
    assert os.path.samefile(ckpts / "last.ckpt", ckpts / "step0000006.ckpt")
    assert step_of(ckpts / "last.ckpt") == 6  # loadable, and the newest state saved
    filler.unlink()
    status, err = cli(train_module.main, tiny(run, cache, *keep_all, steps=8), monkeypatch, capsys)
    assert status == 0, err[-3000:]
    results = json.loads((run / "results.json").read_text())
    assert results["steps"] == 8 and results["resumed_from"] == str(ckpts / "last.ckpt")
    assert (results["schedule"][-1]["from_step"], results["schedule"][-1]["to_step"]) == (6, 8)

    # results.json: the disk fills when training ends
    fills = ["+callbacks.fill._target_=tests.test_checkpoints.FillDisk", f"+callbacks.fill.path={small_disk}"]
    status, err = cli(train_module.main, tiny(run, cache, *keep_all, *fills, steps=10), monkeypatch, capsys)
    assert status == 1 and "Traceback" not in err, err[-3000:]
    assert f"to write {run / 'results.json'}: it was not written" in err.strip().splitlines()[-2]
    assert step_of(ckpts / "last.ckpt") == 10 and partial_files(run) == []
    assert sorted(p.name for p in ckpts.glob(".*")) == []
    assert '"steps": 8' in (run / "results.json").read_text()  # the previous one, whole

    (small_disk / "filler").unlink()
    assert run_train(run, cache, *keep_all, steps=10)["steps"] == 10  # space freed: the same command finishes


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
