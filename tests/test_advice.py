"""A command that a line of `posenc-lab train` advises, run as the line gives it (its placeholders filled in),
makes progress from the state that printed it. (The continue commands of ablate and sweep: tests/ablate
and tests/sweeps.)"""

from __future__ import annotations

import json
import logging
import shlex

from posenc_lab.checkpoints import read_checkpoint
from tests.helpers_train import no_stale_log_handlers, run_train  # noqa: F401 - an autouse fixture
from tests.test_checkpoints import DIVERGES


def test_the_command_a_diverged_run_advises_continues_from_its_good_checkpoint(tmp_path, cache, caplog):
    """A run that diverges names good.ckpt and `resume=GOOD run_dir=NEW_DIR optim.lr=LOWER`: with a new folder and a
    lower rate, that command trains on from the good checkpoint's step to a healthy end."""
    with caplog.at_level(logging.WARNING, logger="posenc_lab"):
        run_train(tmp_path / "diverged", cache, *DIVERGES, steps=10)
    (line,) = [r.getMessage() for r in caplog.records if "is not healthy" in r.getMessage()]
    advised = shlex.split(line.split("; continue: ", 1)[1])
    assert [a.split("=", 1)[0] for a in advised] == ["resume", "run_dir", "optim.lr"], line
    assert advised[1:] == ["run_dir=NEW_DIR", "optim.lr=LOWER"]
    good = advised[0].split("=", 1)[1]
    step = int(read_checkpoint(good)["global_step"])
    new = tmp_path / "continued"
    run_train(new, cache, *DIVERGES, advised[0], "optim.lr=0.001", steps=10)  # tiny() names run_dir: NEW_DIR
    results = json.loads((new / "results.json").read_text())
    assert results["resumed_from"] == good and 0 < step < results["steps"] == 10
    assert results["health"]["ok"] is True, results["health"]
