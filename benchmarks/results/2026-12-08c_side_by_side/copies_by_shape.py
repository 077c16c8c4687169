"""The xl `small` bare step profiled by input shape: the copies, dropout masks, adds, cats and fills of a step,
largest first. From the repository root:

    python benchmarks/results/2026-12-08c_side_by_side/copies_by_shape.py
"""

import tempfile
from pathlib import Path

import torch

from posenc_lab.bench.overhead import overrides, time_bare
from posenc_lab.compose import compose

STEPS = 3
KINDS = ("aten::copy_", "aten::bernoulli_", "aten::cat", "aten::fill_", "aten::add")

extra = ["posenc=xl", "model=small", "trainer.accelerator=cpu"]
with tempfile.TemporaryDirectory() as tmp:
    cfg = compose("train", overrides("small", 2, STEPS, str(Path(tmp) / "run"), extra))
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True)
    time_bare(cfg, 2, STEPS, torch.device("cpu"), window=prof)
events = [e for e in prof.key_averages(group_by_input_shape=True) if e.key in KINDS]
for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:14]:
    ms = e.self_cpu_time_total / 1e3 / STEPS
    print(f"{e.key:18s} {ms:7.2f} ms/step calls {e.count // STEPS:4d} {str(e.input_shapes)[:100]}")
