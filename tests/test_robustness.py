"""Faults and bad inputs (issue 10): checkpoints carry data only, a run directory holds one run,
a checkpoint is called good only if it is, nothing is half-written, every bad value is named."""

from __future__ import annotations

import json
import math
import os
import pickle
import subprocess
import sys
import time

import pytest
import torch

from posenc_lab.checkpoints import SANE_LOSS_RATIO, SANE_WEIGHT_ABS, CheckpointError, read_checkpoint
from posenc_lab.errors import ConfigError, PosencLabError, deliberate
from posenc_lab.evaluate import evaluate_checkpoint, output_dir, output_name
from posenc_lab.io import CorruptFileError
from posenc_lab.lit import NonFiniteLossError
from posenc_lab.rundir import RunDirError
from posenc_lab.train import train
from tests.helpers_train import REPO, compose_config, run_module, subprocess_env, tiny


def run_train(run_dir, cache, *extra, steps=4, data="recall"):
    return train(compose_config("train", tiny(run_dir, cache, *extra, steps=steps, data=data)))


# ---- checkpoints carry data, never code ----------------------------------------------------------


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


# ---- a checkpoint is only called good if it is -----------------------------------------------------


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


# ---- errors name the key, before anything is written ---------------------------------------------


@pytest.mark.parametrize(
    "override, message",
    [
        ("optim.lr=-1", r"optim\.lr must be a number > 0, got -1"),
        ("data.batch_size=abc", r"data\.batch_size must be an integer >= 1, got 'abc'"),
        ("optim.warmup_steps=-5", r"optim\.warmup_steps must be an integer >= 0, got -5"),
        ("checkpoint_every=0", r"checkpoint_every must be an integer >= 1, got 0"),
        ("data.eval_batch_size=1000", r"the val split of data\.name=recall is too short.*eval_batch_size"),
        ("trainer.max_steps=0", r"trainer\.max_steps must be an integer >= 1"),
    ],
)
def test_bad_values_are_named_before_anything_is_written(tmp_path, cache, override, message):
    with pytest.raises(ConfigError, match=message):
        run_train(tmp_path / "run", cache, override)
    assert not (tmp_path / "run").exists()


def test_learned_overflow_advice_is_an_option_eval_takes(tmp_path, cache):
    from posenc_lab.evaluate import evaluate_main
    from tests.helpers_train import compose_config as compose

    run_train(tmp_path / "run", cache, "posenc=learned", "posenc.max_positions=16", steps=2)
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    with pytest.raises(ValueError, match=r"posenc\.overflow=clamp") as info:
        evaluate_checkpoint(ckpt, segment_len=32, max_batches=1)
    assert deliberate(info.value)
    # The advice, as typed on the command line, is taken by `posenc-lab eval`.
    cfg = compose(
        "eval",
        [
            f"ckpt={ckpt}",
            "data.segment_len=32",
            "posenc.overflow=clamp",
            "max_batches=1",
            "progress_bar=false",
            f"out_dir={tmp_path / 'eval'}",
            "accelerator=cpu",
        ],
    )
    evaluate_main(cfg)
    (written,) = output_dir(ckpt, tmp_path / "eval").glob("*.json")
    result = json.loads(written.read_text())
    assert result["scheme_options"] == {"overflow": "clamp"} and math.isfinite(result["loss"])
    assert "overflowclamp" in written.name


@pytest.mark.slow
def test_cli_prints_the_full_trace_on_request(tmp_path, cache):
    full = run_module(
        "posenc_lab.train", *tiny(tmp_path / "run", cache, "optim.lr=-1"), timeout=120, HYDRA_FULL_ERROR="1"
    )
    assert full.returncode == 1 and "Traceback" in full.stderr and "ConfigError" in full.stderr


def test_only_errors_raised_in_posenc_lab_count_as_deliberate():
    try:
        torch.zeros(2).view(3)  # torch's own RuntimeError
    except RuntimeError as e:
        assert not deliberate(e)
    try:
        int("x")  # a ValueError from Python, not from posenc_lab
    except ValueError as e:
        assert not deliberate(e)
    assert deliberate(ConfigError("a.b must be ...")) and isinstance(ConfigError("x"), ValueError)
    assert issubclass(CheckpointError, PosencLabError) and issubclass(RunDirError, ValueError)


# ---- a run directory belongs to one run ---------------------------------------------------------


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


@pytest.mark.slow
def test_multirun_with_a_fixed_run_dir_gives_every_job_its_own_run(tmp_path, cache):
    proc = run_module("posenc_lab.train", "-m", "seed=0,1", *tiny(tmp_path / "sweep", cache, steps=2), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = {p.parent.name: json.loads(p.read_text()) for p in (tmp_path / "sweep").glob("*/results.json")}
    assert {r["seed"] for r in results.values()} == {0, 1} and len(results) == 2
    assert all(r["run_dir"] == str(tmp_path / "sweep" / name) for name, r in results.items())


# ---- nothing half-written -----------------------------------------------------------------------


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


def test_eval_outputs_are_named_by_every_setting_and_rewritten_whole(tmp_path, finished):
    from posenc_lab.evaluate import evaluate_main
    from tests.helpers_train import compose_config as compose

    def evaluate(*overrides):
        cfg = compose(
            "eval",
            [
                f"ckpt={finished / 'checkpoints' / 'last.ckpt'}",
                "progress_bar=false",
                "accelerator=cpu",
                f"out_dir={tmp_path}",
                "dump_losses=true",
                *overrides,
            ],
        )
        evaluate_main(cfg)

    evaluate("max_batches=2")
    evaluate("max_batches=3")
    evaluate("max_batches=2", "data.episode_len=32")
    evaluate("max_batches=2", "data.batch_size=2")
    out = output_dir(finished / "checkpoints" / "last.ckpt", tmp_path)  # a folder per run and checkpoint
    names = sorted(p.stem for p in out.glob("*.json"))
    assert names == [
        "test_step4_L16_M16_T32_B4_first2",
        "test_step4_L16_M16_Tnone_B2_first2",
        "test_step4_L16_M16_Tnone_B4_first2",
        "test_step4_L16_M16_Tnone_B4_first3",
    ]
    with pytest.raises(ConfigError, match=r"max_batches must be an integer >= 1 .*null: all.*got 0"):
        evaluate("max_batches=0")
    first = json.loads((out / "test_step4_L16_M16_Tnone_B4_first2.json").read_text())
    assert output_name({**first, "precision": "bf16-mixed"}) == "test_step4_L16_M16_Tnone_B4_first2_bf16-mixed"
    assert output_name({**first, "data_overrides": {"corpus": {"eval_max_distance": 60}}}).startswith(
        "test_step4_L16_M16_Tnone_B4_first2_data-"
    )

    # A truncated output (e.g. a full disk under another tool) is written whole by the next eval.
    target = out / "test_step4_L16_M16_Tnone_B4_first2"
    target.with_suffix(".json").write_text('{"loss": ')
    target.with_suffix(".npz").write_bytes(target.with_suffix(".npz").read_bytes()[:100])
    evaluate("max_batches=2")
    assert math.isfinite(json.loads(target.with_suffix(".json").read_text())["loss"])
    from posenc_lab.io import load_npz

    assert load_npz(target.with_suffix(".npz"))["token_loss"].shape == (4, 2 * 16)
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary files left


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
