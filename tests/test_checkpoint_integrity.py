"""No step lost on resume (issue 27): last.ckpt is the newest state whatever checkpoint_every was, the two good
checkpoints are two files after any sequence of resumes, and a stop logs the metrics of the step it stopped at."""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch

from posenc_lab.checkpoints import SANE_LOSS_RATIO, Checkpointing, read_checkpoint
from posenc_lab.errors import Interrupted
from tests.test_reliability import no_stale_log_handlers, run_train, signal_at, step_of  # noqa: F401 - autouse fixture


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
    return ["+callbacks.crash._target_=tests.test_checkpoint_integrity.CrashAt", f"+callbacks.crash.step={step}"]


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
