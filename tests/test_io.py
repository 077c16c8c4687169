"""Files written atomically and read with a named error (posenc_lab/io.py): damaged files are
recovered or named with what to delete, a full disk is one line."""

from __future__ import annotations

import errno
import json

import pytest

from posenc_lab.checkpoints import CheckpointError
from posenc_lab.io import CorruptFileError
from posenc_lab.rundir import RunDirError
from tests.helpers_train import (
    no_stale_log_handlers,  # noqa: F401 - an autouse fixture
    run_train,
)


def test_truncated_files_are_recovered_or_named_with_what_to_delete(tmp_path, cache):
    run = tmp_path / "run"
    run_train(run, cache, "checkpoint_every=2", steps=4)

    # results.json: the next run of the same command writes it whole again.
    results = run / "results.json"
    results.write_text(results.read_text()[:40])
    run_train(run, cache, "checkpoint_every=2", steps=4)
    assert json.loads(results.read_text())["steps"] == 4

    # run.json: named, with what to delete; after deleting it the run is recognised by its checkpoint.
    record = run / "run.json"
    record.write_text(record.read_text()[:50])
    with pytest.raises(CorruptFileError, match=r"run\.json is corrupt or truncated.*delete it"):
        run_train(run, cache, "checkpoint_every=2", steps=4)
    record.unlink()
    with pytest.raises(RunDirError, match=r"seed: run 0, now 3"):  # still guarded: identity from the checkpoint
        run_train(run, cache, "checkpoint_every=2", "seed=3", steps=4)
    assert run_train(run, cache, "checkpoint_every=2", steps=4)["steps"] == 4
    assert json.loads(record.read_text())["identity"]["seed"] == 0

    # last.ckpt: named, with what to delete; then the run resumes from the newest other checkpoint.
    last = run / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[:2000])
    with pytest.raises(CheckpointError, match=r"last\.ckpt cannot be read.*Delete it to resume from the newest other"):
        run_train(run, cache, "checkpoint_every=2", steps=6)
    last.unlink()
    again = run_train(run, cache, "checkpoint_every=2", steps=6)
    assert again["steps"] == 6 and again["resumed_from"].endswith(".ckpt")


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
