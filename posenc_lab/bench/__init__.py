"""Speed and memory of the positional schemes: ``posenc-lab bench`` / ``python -m posenc_lab.bench``.

For every scheme, with and without memory, per model preset and precision: training tokens/s (forward +
backward + AdamW step, memory carried from step to step), evaluation tokens/s (``no_grad`` forward with
memory reuse), peak memory and model FLOPs utilisation (MFU). One concern per module:

    configs.py  what is timed: a model preset of conf/model/ at a segment length and batch
    schemes.py  the schemes of ``--schemes``, with options (``rope[scaling=dynamic]``), and their points' labels
    flops.py    the model FLOP count (each scheme adds its own: ``PositionalScheme.extra_flops``)
    probes.py   device, autocast, timing, peak memory, the matmul peak, the machine's state
    loops.py    the grid and the timed training / evaluation loops, memory reuse vs a sliding window
    cli.py      the command line; tables are written by ``posenc_lab.tables``
    overhead.py ``bench overhead``: what a training step of ``posenc-lab train`` costs beyond the model's arithmetic

The bf16-mixed vs fp32 loss curves live in ``analysis/loss_curve.py`` (an experiment, not a benchmark).

``python -m posenc_lab.bench`` and ``posenc-lab bench`` ask libgomp for a passive wait policy before torch
loads (``posenc_lab.prefer_passive_openmp``); importing this package changes no environment variable and
loads its modules only when one of the names below is used.
"""

from __future__ import annotations

import importlib

_HOMES = {  # name -> the module of this package that owns it
    "PRECISIONS": "configs",
    "BenchConfig": "configs",
    "model_presets": "configs",
    "model_flops_per_token": "flops",
    "combine_rounds": "cli",
    "COLUMNS": "loops",
    "POINT_KEYS": "loops",
    "BenchResult": "loops",
    "Point": "loops",
    "bench_one": "loops",
    "grid": "loops",
    "make_optimizer": "loops",
    "measure_eval_speed": "loops",
    "run_benchmark": "loops",
    "PeakMemory": "probes",
    "autocast": "probes",
    "environment_line": "probes",
    "matmul_peak_flops": "probes",
    "median_time": "probes",
    "pick_device": "probes",
}


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: list[str] | None = None, omp_policy_applies: bool | None = None) -> int:
    """The command line (``cli.main``; loaded when called: importing this package loads no module, see above)."""
    return importlib.import_module(".cli", __name__).main(argv, omp_policy_applies=omp_policy_applies)


__all__ = ["main", *_HOMES]
