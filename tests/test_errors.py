"""Errors raised on purpose (posenc_lab/errors.py): which count as deliberate, and the full
trace on request."""

from __future__ import annotations

import pytest
import torch

from posenc_lab.checkpoints import CheckpointError
from posenc_lab.errors import ConfigError, PosencLabError, deliberate
from posenc_lab.rundir import RunDirError
from tests.helpers_train import run_module, tiny


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
