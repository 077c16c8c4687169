"""posenc_lab/distributed.py: when a DDP training step asks the other ranks for a stop signal (a collective and a
host read), driven through ``Checkpointing``'s step end as Lightning calls it, with a trainer of two ranks."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import torch

from posenc_lab.checkpoints import Checkpointing
from posenc_lab.distributed import stop_check_due


class Ranks:
    """The strategy of a 2-rank run: ``reduce`` counts its calls (each a collective and, read, a host sync) and
    answers the maximum over this rank's value and ``other`` (what the other rank holds)."""

    def __init__(self, other: int = 0):
        self.other, self.calls = other, []

    def reduce(self, tensor, reduce_op):
        assert reduce_op == "max"
        self.calls.append(int(tensor))
        return torch.maximum(tensor, torch.tensor(self.other))


def trainer_at(step: int, strategy: Ranks, every: int = 10, max_steps: int = 25):
    return SimpleNamespace(
        world_size=2, global_step=step, log_every_n_steps=every, max_steps=max_steps, strategy=strategy,
        is_global_zero=True, should_stop=False, loggers=[],
    )  # fmt: skip


def run_steps(callback: Checkpointing, strategy: Ranks, steps, signal_at: int | None = None) -> list[int]:
    """The steps (global_step after the update) whose end asked the ranks; a signal arrives in this process
    during step ``signal_at``."""
    asked, module = [], SimpleNamespace(device=torch.device("cpu"))
    for step in steps:
        if step == signal_at:
            callback._stop = signal.SIGTERM
        before = len(strategy.calls)
        callback._stop_if_asked(trainer_at(step, strategy), module)
        if len(strategy.calls) > before:
            asked.append(step)
        if callback._stopping is not None:
            break
    return asked


def test_ddp_steps_ask_the_ranks_only_at_logged_steps_and_the_last(tmp_path):
    callback, strategy = Checkpointing(dirpath=tmp_path), Ranks()
    assert run_steps(callback, strategy, range(1, 26)) == [10, 20, 25]  # not every step: no host sync between


def test_a_signal_on_one_rank_stops_every_rank_at_the_next_logged_step(tmp_path):
    saved = []
    for this_rank_signal, other in ((13, 0), (None, int(signal.SIGTERM))):  # here, or on the other rank only
        callback, strategy = Checkpointing(dirpath=tmp_path), Ranks(other=other if this_rank_signal is None else 0)
        callback._save_checkpoint = lambda trainer, path: saved.append(trainer.global_step)
        asked = run_steps(callback, strategy, range(11, 26), signal_at=this_rank_signal)
        assert asked == [20] and callback._stopping is not None and callback._stopping.signum == signal.SIGTERM
    assert saved == [20, 20]


def test_stop_check_due_counts_from_the_step_and_every_step_at_an_interval_of_one():
    due = [s for s in range(1, 8) if stop_check_due(trainer_at(s, Ranks(), every=3, max_steps=7))]
    assert due == [3, 6, 7]
    assert all(stop_check_due(trainer_at(s, Ranks(), every=1, max_steps=-1)) for s in range(1, 5))
    assert [s for s in range(1, 8) if stop_check_due(trainer_at(s, Ranks(), every=3, max_steps=-1))] == [3, 6]
