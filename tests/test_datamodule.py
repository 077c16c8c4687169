"""posenc_lab/datamodule.py: the loaders a trainer gets on the CPU and on CUDA (pinned batches, worker processes),
and the order of the batches they yield: the stream's own, so memory stays the true left context."""

from __future__ import annotations

import itertools
import warnings
from types import SimpleNamespace

import pytest
import torch

from posenc_lab.datamodule import CUDA_WORKERS, SegmentDataModule


def trainer_on(device: str, step: int = 0):
    """What the datamodule reads of a one-process trainer whose strategy runs on ``device``."""
    strategy = SimpleNamespace(root_device=torch.device(device))
    return SimpleNamespace(strategy=strategy, global_rank=0, world_size=1, global_step=step, accumulate_grad_batches=1)


def datamodule(tmp_path, device: str, step: int = 0, **options) -> SegmentDataModule:
    dm = SegmentDataModule(
        name="recall", segment_len=16, batch_size=4, root=str(tmp_path),
        corpus={"train_tokens": 20000, "eval_tokens": 3000}, **options,
    )  # fmt: skip
    dm.trainer = trainer_on(device, step)
    dm.setup("fit")
    return dm


@pytest.mark.parametrize(
    "device, options, workers, pinned",
    [("cpu", {}, 0, False), ("cuda", {}, CUDA_WORKERS, True), ("cuda", {"num_workers": 0}, 0, True),
     ("cpu", {"num_workers": 1}, 1, False)],
)  # fmt: skip
def test_cuda_loaders_pin_and_make_batches_in_workers_the_cpu_keeps_none(tmp_path, device, options, workers, pinned):
    dm = datamodule(tmp_path, device, **options)
    for loader in (dm.train_dataloader(), dm.val_dataloader()):
        assert (loader.num_workers, loader.pin_memory) == (workers, pinned)


def test_cuda_workers_keep_the_order_of_a_resumed_variable_length_stream(tmp_path):
    """The CUDA loader (workers, pinning: a no-op without a GPU) yields exactly the stream's batches, in order, from
    the resumed step on: none reordered, repeated or skipped, variable lengths and episode resets included."""
    dm = datamodule(tmp_path, "cuda", step=7, var_len=True, episode_len=64)
    loader = dm.train_dataloader()
    assert loader.num_workers == CUDA_WORKERS > 1
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*pin_memory.*")  # no accelerator here: nothing to pin
        got = list(itertools.islice(iter(loader), 13))
    stream = dm.make_stream("train")
    stream.start_batch = 7
    want = list(itertools.islice(iter(stream), 13))
    assert len({b["tokens"].shape[1] for b in want}) > 1 and any(bool(b["reset"]) for b in want)  # the test can see
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
