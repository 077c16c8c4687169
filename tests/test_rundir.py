"""A run directory holds one run (posenc_lab/rundir.py): another run's settings are refused
naming each difference, a folder of other files is refused, a refused run leaves nothing behind."""

from __future__ import annotations

import json
import os
import time

import pytest

from posenc_lab.checkpoints import read_checkpoint
from posenc_lab.errors import ConfigError
from posenc_lab.rundir import RunDirError
from tests.helpers_train import run_module, run_train, tiny


def _snapshot(directory):
    """{relative path: (size, mtime_ns)} of every file under ``directory``."""
    return {
        str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def test_another_seed_or_model_in_a_finished_run_dir_is_refused_and_nothing_changes(finished, cache):
    before = _snapshot(finished)
    with pytest.raises(RunDirError, match=r"holds another run.*seed: run 0, now 5"):
        run_train(finished, cache, "checkpoint_every=2", "seed=5")
    with pytest.raises(RunDirError, match=r"optim\.lr: run 0\.001, now 0\.002"):
        run_train(finished, cache, "checkpoint_every=2", "optim.lr=2e-3")
    with pytest.raises(ConfigError, match=r"trainer\.max_steps=2 is below the step .* never shortened"):
        run_train(finished, cache, "checkpoint_every=2", steps=2)
    with pytest.raises(RunDirError, match="resume=null would start run_dir .* over"):
        run_train(finished, cache, "checkpoint_every=2", "resume=null")
    assert _snapshot(finished) == before


def test_refused_command_line_run_prints_one_line_and_writes_nothing_not_even_hydra_files(finished, cache):
    before = _snapshot(finished)
    proc = run_module("posenc_lab.train", *tiny(finished, cache, "checkpoint_every=2", "seed=5", steps=4), timeout=120)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith(f"posenc-lab train: error: run_dir {finished} holds another run; it differs in seed")
    assert "Traceback" not in proc.stderr and lines[1:] == ["(set HYDRA_FULL_ERROR=1 for the full traceback)"]
    assert _snapshot(finished) == before  # no .hydra/, no train.log, no config.yaml rewritten


def test_same_length_text_with_other_content_is_another_corpus(tmp_path, cache):
    text = tmp_path / "corpus.txt"
    text.write_bytes(bytes(range(97, 123)) * 1000)
    run_train(tmp_path / "run", cache, f"data.corpus.path={text}", data="textfile", steps=2)
    text.write_bytes(bytes(range(65, 91)) * 1000)  # same length, other bytes
    with pytest.raises(RunDirError, match=r"corpus\.sha256: run '[0-9a-f]+', now '[0-9a-f]+'"):
        run_train(tmp_path / "run", cache, f"data.corpus.path={text}", data="textfile", steps=4)


def test_a_folder_that_is_not_a_run_is_refused(tmp_path, cache):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    with pytest.raises(RunDirError, match=r"holds files but is not a posenc-lab run.*notes\.txt"):
        run_train(folder, cache)
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]


def test_wall_time_accumulates_over_invocations(tmp_path, cache):
    first = run_train(tmp_path / "run", cache, steps=2)
    second = run_train(tmp_path / "run", cache, steps=4)  # a longer max_steps extends the run
    assert second["steps"] == 4 and second["resumed_from"]
    assert second["wall_time_s"] > first["wall_time_s"] > 0
    saved = read_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")["posenc_lab"]["wall_time_s"]
    assert first["wall_time_s"] < saved <= second["wall_time_s"]


@pytest.mark.slow
def test_multirun_with_a_fixed_run_dir_gives_every_job_its_own_run(tmp_path, cache):
    proc = run_module("posenc_lab.train", "-m", "seed=0,1", *tiny(tmp_path / "sweep", cache, steps=2), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = {p.parent.name: json.loads(p.read_text()) for p in (tmp_path / "sweep").glob("*/results.json")}
    assert {r["seed"] for r in results.values()} == {0, 1} and len(results) == 2
    assert all(r["run_dir"] == str(tmp_path / "sweep" / name) for name, r in results.items())


def test_a_checkpoint_saved_by_another_process_while_starting_is_not_overwritten(tmp_path, cache, monkeypatch):
    from posenc_lab.rundir import RunDir, RunLock

    run = tmp_path / "run"
    run_train(run, cache, "checkpoint_every=2", steps=2)
    last = run / "checkpoints" / "last.ckpt"

    class LockAfterAnotherSave(RunLock):
        def __enter__(self):  # another process finished a save between our checks and our lock
            os.utime(last, ns=(time.time_ns(), time.time_ns() + 10**9))
            return super().__enter__()

    monkeypatch.setattr(RunDir, "lock", lambda self: LockAfterAnotherSave(self.path))
    before = last.read_bytes()
    with pytest.raises(RunDirError, match="changed while this run was starting"):
        run_train(run, cache, "checkpoint_every=2", steps=4)
    assert last.read_bytes() == before and not (run / ".lock").exists()


def test_a_refused_new_run_dir_leaves_nothing_behind(tmp_path):
    """Hydra creates the run directory before the checks run: a run refused there removes the folder it
    made (with the log a bf16 warning may have started in it), and never a folder the user made."""
    cache = tmp_path / "cache"
    bad = ("model.n_head=3", "trainer.precision=bf16-mixed", "bf16_check=warn")  # 3 does not divide d_model
    new = tmp_path / "new_run"
    proc = run_module("posenc_lab.train", *tiny(new, cache, *bad), timeout=120)
    assert proc.returncode == 1 and "n_head=3" in proc.stderr, proc.stderr[-2000:]
    assert not new.exists()
    mine = tmp_path / "made_by_the_user"
    mine.mkdir()
    proc = run_module("posenc_lab.train", *tiny(mine, cache, *bad), timeout=120)
    assert proc.returncode == 1 and mine.is_dir()
