"""Known outcome on the recall probe: a memory scheme (xl) answers queries at distances beyond the
segment length far better than chance, and the same model without memory does not.

Fast version: conf/experiment/recall.yaml cut to 250 steps (segments of 16, memory 32, D in 2..40):
xl with memory reached 86-88% beyond one segment with seeds 0, 1, 2 (150 steps: about 60%).
Slow version: the larger recall_long preset (segments of 32, memory 64, D up to 80, 1,000 steps)."""

from __future__ import annotations

import numpy as np
import pytest

from posenc_lab.compose import compose
from posenc_lab.train import train
from posenc_lab_analysis.dumps import AsTrained, as_trained
from posenc_lab_analysis.recall import accuracy_by_distance
from posenc_lab_analysis.runs import load_run


def accuracy_beyond_segment(run_dir, n_tokens: int = 2048) -> tuple[float, float, int]:
    run = load_run(run_dir)
    dump = as_trained(run, AsTrained(16, n_tokens), "test", run_dir / "dump.npz")
    acc = accuracy_by_distance(run, dump)
    beyond = acc[acc["bin_lo"] >= run.segment_len]
    return (
        float(np.average(beyond["accuracy"], weights=beyond["answers"])),
        float(acc["chance"].iloc[0]),
        int(beyond["answers"].sum()),
    )


def train_recall(tmp_path, name: str, preset: str, *overrides: str):
    cfg = compose(
        "train",
        [f"experiment={preset}", "logger=none", "final_eval.limit_batches=2", *overrides, f"run_dir={tmp_path / name}"],
    )
    train(cfg)
    return tmp_path / name


def check(tmp_path, preset: str, *overrides: str):
    with_memory = accuracy_beyond_segment(train_recall(tmp_path, "xl_mem", preset, "posenc=xl", *overrides))
    without = accuracy_beyond_segment(
        train_recall(tmp_path, "xl_nomem", preset, "posenc=xl", "model.mem_len=0", *overrides)
    )
    (acc_mem, chance, n_mem), (acc_none, _, n_none) = with_memory, without
    print(
        f"{preset}: accuracy beyond the segment: xl with memory {acc_mem:.3f} ({n_mem} answers), without "
        f"{acc_none:.3f} ({n_none}); chance {chance:.3f}"
    )
    assert n_mem > 300 and n_none > 300
    assert acc_mem > max(0.4, 6 * chance)  # far better than chance
    assert acc_none < 2 * chance  # no memory: nothing past the segment to answer from


def test_xl_with_memory_recalls_beyond_the_segment_and_without_memory_does_not(tmp_path):
    check(tmp_path, "recall", "trainer.max_steps=250")


@pytest.mark.slow
def test_recall_long_preset(tmp_path):
    check(tmp_path, "recall_long", "trainer.enable_progress_bar=false")
