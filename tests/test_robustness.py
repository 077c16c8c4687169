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

from posenc_lab.errors import ConfigError, PosencLabError, deliberate
from posenc_lab.evaluate import evaluate_checkpoint, output_name
from posenc_lab.io import CorruptFileError
from posenc_lab.lit import SANE_LOSS_RATIO, SANE_WEIGHT_ABS, CheckpointError, NonFiniteLossError, read_checkpoint
from posenc_lab.rundir import RunDirError, RunLock
from posenc_lab.train import train
from tests.helpers_train import REPO, compose_config, run_module, subprocess_env, tiny


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("corpus-cache")


@pytest.fixture(scope="module")
def finished(tmp_path_factory, cache):
    """A finished 4-step run: its directory."""
    run = tmp_path_factory.mktemp("finished") / "run"
    train(compose_config("train", tiny(run, cache, "checkpoint_every=2", steps=4)))
    return run


def run_train(run_dir, cache, *extra, steps=4):
    return train(compose_config("train", tiny(run_dir, cache, *extra, steps=steps)))


# ---- checkpoints carry data, never code ----------------------------------------------------------

class _WritesMarker:
    """Unpickling this object creates the marker file (a stand-in for any code a file could run)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


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

def test_after_a_divergence_the_named_checkpoint_resumes_and_trains_finitely(tmp_path, cache, finished):
    """The issue's case, optim.lr=1e3: every update blows the weights up. A fresh run names no checkpoint
    as good (none is); continuing a sane run at that lr names a checkpoint that resumes with a sane lr."""
    with pytest.raises(NonFiniteLossError, match="No good checkpoint was saved before it"):
        run_train(tmp_path / "fresh", cache, "optim.lr=1e3", "checkpoint_every=1", steps=40)

    start = finished / "checkpoints" / "last.ckpt"
    with pytest.raises(NonFiniteLossError) as info:
        run_train(tmp_path / "diverged", cache, f"resume={start}", "optim.lr=1e3", "checkpoint_every=1", steps=40)
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
