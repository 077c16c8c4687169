"""A run that fails (posenc_lab/train.py, errors.py): before its first step it leaves nothing that a corrected
rerun into its folder would take for another run; memory running out, in training or evaluation, on the CPU or a
GPU, is one line naming the sizes and the checkpoint kept. The allocator's refusal is real: a petabyte asked of it
in the model's forward pass."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from posenc_lab import evaluate
from posenc_lab import train as train_module
from posenc_lab.errors import out_of_memory, reported
from posenc_lab.lit import LitLM
from tests.helpers_train import cli, compose_config, no_stale_log_handlers, run_train, step_of, tiny  # noqa: F401 - autouse fixture

PETABYTE = 1 << 50


@pytest.fixture
def refuse_memory(monkeypatch):
    """``refuse_memory(when)``: the forward pass of a segment asks the allocator for a petabyte on the model's device
    whenever ``when(lit, split)`` holds."""

    def install(when):
        forward = LitLM.forward_segment

        def forward_segment(self, batch, split):
            if when(self, split):
                torch.empty(PETABYTE, dtype=torch.uint8, device=self.device)
            return forward(self, batch, split)

        monkeypatch.setattr(LitLM, "forward_segment", forward_segment)

    return install


def _memory_line(err: str, command: str, where: str) -> str:
    """The error line of an out-of-memory failure (the line after it says how to get the traceback)."""
    lines = err.strip().splitlines()
    assert "Traceback" not in err and lines[-1] == "(set HYDRA_FULL_ERROR=1 for the full traceback)", err[-3000:]
    line = lines[-2]
    assert line.startswith(f"posenc-lab {command}: error: out of memory on the {where} ("), line
    assert f"allocate {PETABYTE} bytes" in line or "Tried to allocate" in line, line
    return line


def _model_sizes() -> str:
    """``model.n_layer=.., model.d_model=.., model.n_head=..`` of the tiny model the runs here train."""
    model = compose_config("train", ["model=tiny"]).model
    return ", ".join(f"model.{key}={model[key]}" for key in ("n_layer", "d_model", "n_head"))


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_memory_running_out_in_the_first_forward_leaves_no_run_folder_and_the_corrected_rerun_trains(
    tmp_path, cache, monkeypatch, capsys, refuse_memory
):
    """It failed after run.json, config.yaml, hparams.yaml and train.log were written; the rerun with a sane mem_len
    was then refused as "another run"."""
    refuse_memory(lambda lit, split: lit.model.cfg.mem_len == 4096)  # a memory too long for this machine
    run = tmp_path / "run"
    status, err = cli(train_module.main, tiny(run, cache, "model.mem_len=4096"), monkeypatch, capsys)
    line = _memory_line(err, "train", "CPU")
    assert status == 1 and not run.exists(), sorted(p.name for p in run.iterdir())
    sizes = (
        f"at data.batch_size=4, data.segment_len=16, model.mem_len=4096, {_model_sizes()}, trainer.precision=32-true"
    )
    assert f"{sizes}: lower data.batch_size, data.segment_len or model.mem_len" in line, line
    assert line.endswith("; no checkpoint was saved before it"), line

    status, err = cli(train_module.main, tiny(run, cache, "model.mem_len=16"), monkeypatch, capsys)
    assert status == 0, err[-3000:]
    results = json.loads((run / "results.json").read_text())
    assert results["steps"] == 4 and results["mem_len"] == 16


def test_a_folder_that_existed_keeps_only_what_it_held_and_a_corrected_rerun_takes_it_over(
    tmp_path, cache, refuse_memory
):
    """From Python (no Hydra log) into a folder made beforehand: the folder stays, empty, and is the rerun's."""
    refuse_memory(lambda lit, split: lit.model.cfg.mem_len == 4096)
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(RuntimeError, match="DefaultCPUAllocator"):
        run_train(run, cache, "model.mem_len=4096", "logger=csv")
    assert run.is_dir() and list(run.iterdir()) == []
    assert run_train(run, cache, "model.mem_len=16")["steps"] == 4


def test_a_failure_at_the_first_step_of_an_extension_changes_nothing_the_run_had(
    tmp_path, finished, monkeypatch, capsys, refuse_memory, cache
):
    """Only a new run's files are removed: a run folder that held a run keeps its record, checkpoints and results."""
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    kept = {k: v for k, v in _files(run).items() if k.startswith(("run.json", "results.json", "checkpoints/"))}
    refuse_memory(lambda lit, split: split == "train")
    status, err = cli(train_module.main, tiny(run, cache, "checkpoint_every=2", steps=6), monkeypatch, capsys)
    line = _memory_line(err, "train", "CPU")
    last = run / "checkpoints" / "last.ckpt"
    assert status == 1 and f"the newest checkpoint is kept: {last}" in line, line
    assert {k: v for k, v in _files(run).items() if k in kept} == kept


def test_memory_running_out_mid_training_keeps_the_checkpoint_names_it_and_the_same_command_continues(
    tmp_path, cache, monkeypatch, capsys, refuse_memory
):
    refuse_memory(lambda lit, split: split == "train" and lit.trainer.global_step == 3)
    run = tmp_path / "run"
    command = tiny(run, cache, "checkpoint_every=2", steps=6)
    status, err = cli(train_module.main, command, monkeypatch, capsys)
    line = _memory_line(err, "train", "CPU")
    last = run / "checkpoints" / "last.ckpt"
    assert status == 1 and step_of(last) == 2  # the run is kept: it has trained
    assert line.endswith(
        f"; the newest checkpoint is kept: {last}. With more memory free, the same command continues from it; or "
        f"lower data.batch_size, data.segment_len or model.mem_len (or the model: model.n_layer, model.d_model), or "
        f"use trainer.precision=bf16-mixed, with another run_dir"
    ), line
    assert (run / "run.json").is_file() and (run / "checkpoints" / "good.ckpt").is_file()

    monkeypatch.undo()  # memory freed
    status, err = cli(train_module.main, command, monkeypatch, capsys)
    results = json.loads((run / "results.json").read_text())
    assert status == 0 and results["steps"] == 6 and results["resumed_from"] == str(last), err[-3000:]


def test_memory_running_out_in_evaluation_is_one_line_with_the_sizes_evaluated(
    tmp_path, finished, monkeypatch, capsys, refuse_memory
):
    refuse_memory(lambda lit, split: split == "test")
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    ckpt = run / "checkpoints" / "last.ckpt"
    before = _files(run)
    argv = [f"ckpt={ckpt}", "accelerator=cpu", "progress_bar=false", "max_batches=2", "model.mem_len=48"]
    status, err = cli(evaluate.main, argv, monkeypatch, capsys)
    line = _memory_line(err, "eval", "CPU")
    assert status == 1 and _files(run) == before and not (run / "eval").exists()
    assert f"at data.batch_size=4, data.segment_len=16, model.mem_len=48, {_model_sizes()}, precision=32-true" in line
    assert line.endswith(f"precision=bf16-mixed; {ckpt} is unchanged and nothing was written"), line


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA out-of-memory error needs a CUDA device")
def test_cuda_memory_running_out_in_training_and_evaluation_is_the_same_one_line(
    tmp_path, cache, finished, monkeypatch, capsys, refuse_memory
):
    refuse_memory(lambda lit, split: split == "test" or lit.trainer.global_step == 3)
    run = tmp_path / "run"
    gpu = ("trainer=gpu", "checkpoint_every=2")
    status, err = cli(train_module.main, tiny(run, cache, *gpu, steps=6), monkeypatch, capsys)
    line = _memory_line(err, "train", "GPU")
    assert status == 1 and f"the newest checkpoint is kept: {run / 'checkpoints' / 'last.ckpt'}" in line, line
    assert step_of(run / "checkpoints" / "last.ckpt") == 2

    ckpt = finished / "checkpoints" / "last.ckpt"
    argv = [f"ckpt={ckpt}", "accelerator=gpu", "progress_bar=false", "max_batches=2"]
    status, err = cli(evaluate.main, argv, monkeypatch, capsys)
    line = _memory_line(err, "eval", "GPU")
    assert status == 1 and "precision=32-true: lower data.batch_size" in line, line


def test_the_allocators_refusals_are_told_apart_from_other_errors(capsys):
    """torch.cuda.OutOfMemoryError raised by hand (where no CUDA device is) gets the GPU's line."""
    cuda = torch.cuda.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 1.20 GiB "
        "is free. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments"
    )
    cpu = RuntimeError(
        "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
        "allocate 819200000000 bytes. Error code 12 (Cannot allocate memory)"
    )
    assert out_of_memory(cuda) == "GPU" and out_of_memory(cpu) == out_of_memory(MemoryError()) == "CPU"
    assert out_of_memory(RuntimeError("shapes do not match")) is None and out_of_memory(ValueError("memory")) is None
    for error, line in (
        (cuda, "out of memory on the GPU (CUDA out of memory. Tried to allocate 20.00 GiB.) at SIZES"),
        (
            cpu,
            "out of memory on the CPU (DefaultCPUAllocator: can't allocate memory: you tried to allocate "
            "819200000000 bytes.) at SIZES",
        ),
    ):
        with pytest.raises(SystemExit) as info, reported("eval", lambda: "at SIZES"):
            raise RuntimeError("the step failed") from error
        assert info.value.code == 1 and capsys.readouterr().err.splitlines()[0] == f"posenc-lab eval: error: {line}"
