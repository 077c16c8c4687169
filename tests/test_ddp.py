"""Two CPU processes (gloo, trainer=ddp_cpu) against one: disjoint contiguous streams per rank, and
the same losses for the same global batch. Runs the real CLI entry as subprocesses."""

from __future__ import annotations

import json

import pytest

from posenc_lab.checkpoints import read_checkpoint
from posenc_lab.train import train
from tests.helpers_train import compose_config, record, recorded, run_module, tiny


def test_ddp_ranks_take_disjoint_streams_and_match_one_process(tmp_path):
    cache = tmp_path / "cache"
    steps = 4
    # Recall scores few tokens, a different number on each rank: the loss normalisation must be global.
    common = ["data.batch_size=4", "optim.lr=3e-3"]

    def overrides(name, *extra):
        return tiny(tmp_path / name, cache, *common, *extra, *record(tmp_path / f"rec_{name}"), steps=steps)

    # The reference in this process; DDP through the real command line (Lightning re-launches it for rank 1).
    single = train(compose_config("train", overrides("single", "trainer=cpu")))
    args = [a for a in overrides("ddp", "trainer=ddp_cpu", "trainer.devices=2") if not a.startswith("run_dir=")]
    proc = run_module("posenc_lab.train", *args, f"hydra.run.dir={tmp_path / 'ddp'}", timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ddp = json.loads((tmp_path / "ddp" / "results.json").read_text())
    assert single["world_size"] == 1 and ddp["world_size"] == 2

    one = recorded(tmp_path / "rec_single")
    rank0, rank1 = recorded(tmp_path / "rec_ddp", 0), recorded(tmp_path / "rec_ddp", 1)
    assert len(one) == len(rank0) == len(rank1) == steps
    for s, a, b in zip(one, rank0, rank1):
        # rank 0 holds streams 0-1, rank 1 streams 2-3 of the same global batch
        assert len(a["tokens"]) == len(b["tokens"]) == 2
        assert a["tokens"] + b["tokens"] == s["tokens"]
        # each rank's loss is its share of the global mean over scored tokens
        assert (a["loss"] + b["loss"]) / 2 == pytest.approx(s["loss"], abs=1e-4)

    # evaluation sums over ranks too; the checkpoint holds the memory of all four streams
    for split in ("val", "test"):
        assert ddp[split]["tokens"] == single[split]["tokens"]
        assert ddp[split]["loss"] == pytest.approx(single[split]["loss"], abs=1e-4)
    ckpt = read_checkpoint(tmp_path / "ddp" / "checkpoints" / "last.ckpt")  # as data only, like every reader
    assert ckpt["posenc_lab"]["train_mems"][0].shape[0] == 4
