"""``.lock`` (posenc_lab/runlock.py): a second process is refused, a stale lock taken over."""

from __future__ import annotations

import subprocess
import sys

import pytest

from posenc_lab.rundir import RunDirError
from tests.helpers_train import REPO, run_train, subprocess_env

_HOLD_LOCK = (
    "import sys, time; from posenc_lab.rundir import RunLock\n"
    "with RunLock(sys.argv[1]):\n    print('locked', flush=True); time.sleep(120)"
)


def test_a_second_process_is_refused_and_a_stale_lock_is_taken_over(tmp_path, cache, caplog):
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(run)], cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirError, match=rf"being written by another process \(pid {holder.pid} "):
            run_train(run, cache)
    finally:
        holder.kill()  # like kill -9: the lock file stays behind
        holder.wait()
    assert f"pid {holder.pid}" in (run / ".lock").read_text()
    with caplog.at_level("WARNING", logger="posenc_lab.runlock"):
        results = run_train(run, cache, steps=2)
    assert results["steps"] == 2 and f"pid {holder.pid}" in caplog.text and "no longer runs" in caplog.text
    assert not (run / ".lock").exists()
