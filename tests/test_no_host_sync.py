"""The training step never waits for the host: forward, backward, the optimizer and the per-step logging run with
every way of reading a tensor on the host made to raise; the metrics are read every ``log_every_n_steps`` only
(posenc_lab/lit.py). On a GPU each such read stops the device's queue until it drains."""

from __future__ import annotations

import contextlib

import lightning as L
import pytest
import torch

from posenc_lab.train import train
from tests.helpers_train import compose_config, tiny

#: what reads a tensor's value on the host (the issue's four, and the implicit ones of ``if t:`` and ``int(t)``)
HOST_READS = ("item", "cpu", "tolist", "__float__", "__bool__", "__int__")
LOG_EVERY = 4
GUARDED: list[int] = []  # the steps that ran guarded, by the last run


class HostRead(AssertionError):
    pass


@contextlib.contextmanager
def no_host_reads():
    """Every ``HOST_READS`` method of torch.Tensor raises inside."""
    saved = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def refuse(name):
        def method(self, *args, **kwargs):
            raise HostRead(f"Tensor.{name} in the training step: a host sync")

        return method

    try:
        for name in HOST_READS:
            setattr(torch.Tensor, name, refuse(name))
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


class NoHostSync(L.Callback):
    """Guards each training step that logs nothing, from its first hook (the batch already fetched) to the end of
    Lightning's step (optimizer, scheduler, the per-step logging); the logged steps may read."""

    def on_train_start(self, trainer, pl_module):
        GUARDED.clear()
        loop = trainer.fit_loop.epoch_loop
        advance, self._guard = loop.advance, None

        def guarded_advance(*args, **kwargs):
            try:
                return advance(*args, **kwargs)
            finally:
                if self._guard is not None:
                    self._guard.__exit__(None, None, None)
                    self._guard = None

        loop.advance = guarded_advance

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if not trainer._logger_connector.should_update_logs:
            GUARDED.append(trainer.global_step)
            self._guard = no_host_reads()
            self._guard.__enter__()


def test_the_guard_catches_a_host_read():
    with no_host_reads(), pytest.raises(HostRead, match=r"Tensor.item"):
        torch.ones(()).item()
    with no_host_reads(), pytest.raises(HostRead, match=r"Tensor.__bool__"):
        bool(torch.ones(()) > 0)
    assert torch.ones(()).item() == 1.0  # restored


@pytest.mark.parametrize("scheme, bar", [("xl", True), ("fox", False)])
def test_training_steps_read_nothing_on_the_host(tmp_path, cache, scheme, bar):
    """Recall (answers: the accuracy is counted) with memory and resets, fused AdamW, gradient clipping, the
    progress bar on and off."""
    overrides = tiny(
        tmp_path / "run",
        cache,
        f"posenc={scheme}",
        f"trainer.enable_progress_bar={str(bar).lower()}",
        f"trainer.log_every_n_steps={LOG_EVERY}",
        "checkpoint_every=1000",
        "+callbacks.nosync._target_=tests.test_no_host_sync.NoHostSync",
        steps=2 * LOG_EVERY,
    )
    results = train(compose_config("train", overrides))
    assert results["steps"] == 2 * LOG_EVERY
    assert GUARDED == [0, 1, 2, 4, 5, 6]  # every step but the logged ones (3 and 7)
