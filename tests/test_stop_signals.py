"""Stops within a scheduler's grace period: a stop signal during a validation pass of training ends it at
the end of the validation batch with a checkpoint that resumes exactly; SIGHUP stops as SIGTERM does (exit 129)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest

from posenc_lab.errors import Interrupted
from tests.helpers_train import (  # noqa: F401 - autouse fixture
    REPO,
    no_stale_log_handlers,
    record,
    recorded,
    run_module,
    run_train,
    step_of,
    subprocess_env,
    tiny,
)


class SignalInValidation(L.Callback):
    """Sends ``signum`` to this process at validation batch ``batch`` of the pass that follows step ``step``."""

    def __init__(self, step: int, batch: int = 1, signum: str = "SIGTERM"):
        self.step, self.batch, self.signum = int(step), int(batch), getattr(signal, signum)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if trainer.state.fn == "fit" and not trainer.sanity_checking and trainer.global_step == self.step:
            if batch_idx == self.batch:
                os.kill(os.getpid(), self.signum)


class SlowValidation(L.Callback):
    """Each validation batch of training takes ``seconds`` longer; the first one of a pass touches ``marker``."""

    def __init__(self, seconds: float, marker: str):
        self.seconds, self.marker = float(seconds), Path(marker)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self.marker.touch()
            time.sleep(self.seconds)


def test_a_stop_during_validation_ends_the_pass_and_the_run_resumes_exactly(tmp_path, cache):
    """SIGTERM in the validation after step 4: the pass ends at that batch, last.ckpt holds step 4 (saved there:
    checkpoint_every is larger), and the resumed run gives the losses of a run never stopped."""
    common = (
        "model.dropout=0.1",
        "checkpoint_every=100",
        "trainer.val_check_interval=2",
        "trainer.limit_val_batches=6",
    )
    full = run_train(tmp_path / "full", cache, *common, *record(tmp_path / "rec_full"), steps=7)
    stop = ["+callbacks.stop._target_=tests.test_stop_signals.SignalInValidation", "+callbacks.stop.step=4"]
    with pytest.raises(Interrupted) as info:
        run_train(tmp_path / "run", cache, *common, *stop, steps=7)
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert info.value.signum == signal.SIGTERM and info.value.saved == str(last)
    assert str(info.value) == f"stopped by SIGTERM at step 4; saved {last}, before the validation of that step finished"
    assert step_of(last) == 4
    resumed = run_train(tmp_path / "run", cache, *common, *record(tmp_path / "rec_resumed"), steps=7)
    before, after = recorded(tmp_path / "rec_full"), recorded(tmp_path / "rec_resumed")
    assert [s["step"] for s in after] == [5, 6, 7]
    for a, b in zip(before[4:], after):
        assert a["tokens"] == b["tokens"] and a["loss"] == pytest.approx(b["loss"], abs=1e-6, rel=0)
    assert resumed["val"]["loss"] == pytest.approx(full["val"]["loss"], abs=1e-6)
    assert [(s["from_step"], s["to_step"]) for s in resumed["schedule"]] == [(0, 4), (4, 7)]


# ---- real signals from outside ---------------------------------------------------------------------------------


def _start(args) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "posenc_lab.train", *map(str, args)],
        cwd=REPO,
        env=subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize(
    "signum, during",
    [(signal.SIGTERM, "validation"), (signal.SIGHUP, "training")],
    ids=["sigterm-in-validation", "sighup-in-training"],
)
def test_a_real_signal_stops_within_seconds_with_one_line_and_the_run_resumes(tmp_path, cache, signum, during):
    """A validation pass of 40 batches x 1 s (at least 40 s; the probe's took 83 s): the stop comes within a few
    seconds (a batch, the save and the way out; the bound is loose for a loaded machine), exits 128 + the signal,
    prints one line, and the printed step resumes."""
    run, marker = tmp_path / "run", tmp_path / "validating"
    slow = [
        "+callbacks.slow._target_=tests.test_stop_signals.SlowValidation",
        "+callbacks.slow.seconds=1",
        f"+callbacks.slow.marker={marker}",
        "trainer.limit_val_batches=40",
        "trainer.val_check_interval=3",
        "checkpoint_every=2",
    ]
    proc = _start(tiny(run, cache, *slow, steps=1000))
    try:
        _wait_for(marker if during == "validation" else run / "checkpoints" / "last.ckpt", proc)
        sent = time.monotonic()
        proc.send_signal(signum)
        err = proc.communicate(timeout=60)[1]
        took = time.monotonic() - sent
    finally:
        proc.kill()
        proc.wait()
    lines = [line for line in err.splitlines() if line.startswith("posenc-lab train:")]
    assert proc.returncode == 128 + signum and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert took < 20, f"{took:.1f} s from the signal to the exit"
    name = signal.Signals(signum).name
    assert lines[0].startswith(f"posenc-lab train: stopped by {name} at step "), lines[0]
    step = int(lines[0].split(" at step ")[1].split(";")[0])
    assert step_of(run / "checkpoints" / "last.ckpt") == step and f"saved {run}/checkpoints/last.ckpt" in lines[0]
    if during == "validation":
        assert step % 3 == 0 and "before the validation of that step finished" in lines[0]
    done = run_module("posenc_lab.train", *tiny(run, cache, "checkpoint_every=2", steps=step + 2), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((run / "results.json").read_text())
    assert results["steps"] == step + 2 and results["resumed_from"] == str(run / "checkpoints" / "last.ckpt")


def _signal_here(signum: int) -> None:
    """Sends ``signum`` to this process and waits for its handler, which runs between two bytecodes of this loop."""
    os.kill(os.getpid(), signum)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.01)
    raise AssertionError("the signal's handler never ran")


def test_a_stop_that_the_body_turns_into_another_error_is_still_the_stop():
    """Found in CI: SIGTERM during `posenc-lab sweep`'s checks landed inside a `try ... finally` of Hydra's compose,
    whose `finally` then failed on a variable the `try` had not set yet; the check read that error as "does not
    compose" and the command exited 2 with a false problem. The stop must come out whatever the body made of it."""
    from posenc_lab.errors import stop_at_once
    from posenc_lab.sweeps.run import _StoppedBeforeTrials

    def compose_like() -> None:
        try:
            _signal_here(signal.SIGTERM)
            handle = 1
        finally:
            handle  # noqa: B018 - UnboundLocalError: the try was left before the assignment

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(_StoppedBeforeTrials) as stopped:
        with stop_at_once((signal.SIGTERM, signal.SIGINT), raising=_StoppedBeforeTrials):
            try:
                compose_like()
            except Exception as e:  # what the sweep's check does with a trial that does not compose
                raise ValueError(f"does not compose: {e}") from e
    assert stopped.value.signum == signal.SIGTERM
    assert isinstance(stopped.value.__cause__, ValueError)
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_stop_that_the_body_swallows_is_raised_when_the_body_ends():
    """An `except Exception: pass` in the body (a check that returns None on any error) does not lose the stop."""
    from posenc_lab.errors import stop_at_once

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(Interrupted) as stopped:
        with stop_at_once((signal.SIGINT,)):
            try:
                _signal_here(signal.SIGINT)
            except Exception:  # noqa: BLE001 - swallowed, as such code does
                pass
    assert stopped.value.exit_code == 130
    assert signal.getsignal(signal.SIGINT) is before  # the handler it replaced is back
