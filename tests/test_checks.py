"""The one validator (posenc_lab/checks.py): every bad value is named before anything is
written."""

from __future__ import annotations

import pytest

from posenc_lab.errors import ConfigError
from tests.helpers_train import run_train


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
