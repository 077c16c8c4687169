"""Speed and memory of the positional schemes: ``posenc-lab bench`` / ``python -m posenc_lab.bench``.

For every scheme, with and without memory, per model preset and precision: training tokens/s (forward +
backward + AdamW step, memory carried from step to step), evaluation tokens/s (``no_grad`` forward with
memory reuse), peak memory and model FLOPs utilisation (MFU). One concern per module:

    configs.py  what is timed: a model preset of conf/model/ at a segment length and batch
    flops.py    the model FLOP count (each scheme adds its own: ``PositionalScheme.extra_flops``)
    probes.py   device, autocast, timing, peak memory, the matmul peak, the machine's state
    loops.py    the grid and the timed training / evaluation loops, memory reuse vs a sliding window
    cli.py      the command line; tables are written by ``posenc_lab.tables``

The bf16-mixed vs fp32 loss curves live in ``analysis/loss_curve.py`` (an experiment, not a benchmark).

On a shared CPU machine, OpenMP worker threads that spin while another process holds the core slow small
operations by an order of magnitude; this package therefore asks libgomp for a passive wait policy
(``OMP_WAIT_POLICY=PASSIVE``) when it is imported before torch, unless the variable is set already.
"""

from __future__ import annotations

import os
import sys

_OMP_POLICY_APPLIES = "torch" not in sys.modules  # libgomp reads it once, when torch loads it
if _OMP_POLICY_APPLIES:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .configs import PRECISIONS, BenchConfig, model_presets  # noqa: E402 - after the wait policy
from .flops import model_flops_per_token  # noqa: E402
from .loops import (COLUMNS, BenchResult, Point, bench_one, grid, make_optimizer,  # noqa: E402
                    measure_eval_speed, run_benchmark)
from .probes import PeakMemory, autocast, environment_line, matmul_peak_flops, median_time, pick_device  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    from .cli import main as cli_main

    return cli_main(argv, omp_policy_applies=_OMP_POLICY_APPLIES)


__all__ = ["COLUMNS", "PRECISIONS", "BenchConfig", "BenchResult", "PeakMemory", "Point", "autocast", "bench_one",
           "environment_line", "grid", "main", "make_optimizer", "matmul_peak_flops", "measure_eval_speed",
           "median_time", "model_flops_per_token", "model_presets", "pick_device", "run_benchmark"]
