"""A rough timing of rope's scalings and of SSMax against sinusoid, at ``base`` fp32 with memory, through the
benchmark's own step (``posenc_lab.bench.loops.bench_one``). The bench CLI cannot pass scheme options (rope's
scaling), so the points are built here. Rounds alternate the order; each ratio is paired within its round.

    python docs/perf/2026-12-04_scalings/bench.py [rounds] | tee docs/perf/2026-12-04_scalings/bench.txt
"""

from __future__ import annotations

import statistics
import sys

import torch

from posenc_lab.bench.loops import bench_one

ORIG = 128  # original_len below the span M + L = 512 of base: the scalings act, as at evaluation past the span
PAIRS = 32  # d_h / 2 at base (d_model 512, 8 heads)
POINTS = {
    "sinusoid": ("sinusoid", {}),
    "sinusoid+ssmax": ("sinusoid", {"softmax_scale": "ssmax"}),
    "rope": ("rope", {}),
    "rope+ssmax": ("rope", {"softmax_scale": "ssmax"}),
    "rope dynamic": ("rope", {"posenc_kwargs": {"scaling": "dynamic", "factor": 4.0, "original_len": ORIG}}),
    "rope longrope": (
        "rope",
        {
            "posenc_kwargs": {
                "scaling": "longrope",
                "factor": 4.0,
                "original_len": ORIG,
                "short_factor": [1.0] * PAIRS,
                "long_factor": [float(40 ** (c / (PAIRS - 1))) for c in range(PAIRS)],
            }
        },
    ),
}


def main(rounds: int) -> None:
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    times: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in POINTS}
    for r in range(rounds):
        order = list(POINTS) if r % 2 == 0 else list(reversed(POINTS))
        for name in order:
            scheme, overrides = POINTS[name]
            res = bench_one("base", scheme, memory=True, precision="fp32", warmup=2, reps=3, model_overrides=overrides)
            times[name].append((res.train_ms, res.train_cpu_ms, res.eval_ms, res.eval_cpu_ms))
            print(f"round {r} {name:15s} train {res.train_ms:8.1f} ms (cpu {res.train_cpu_ms:8.1f}) "
                  f"eval {res.eval_ms:8.1f} ms (cpu {res.eval_cpu_ms:8.1f})  B={res.batch} L={res.segment_len} "
                  f"M={res.mem_len}", flush=True)  # fmt: skip
    print("\n| point | train ms | train CPU ms | eval ms | train / sinusoid | train CPU / sinusoid | eval / sinusoid |")
    print("|---|---|---|---|---|---|---|")
    base = times["sinusoid"]
    for name, rows in times.items():
        med = [statistics.median(x[i] for x in rows) for i in range(4)]
        ratio = [statistics.median(x[i] / b[i] for x, b in zip(rows, base)) for i in (0, 1, 2)]
        print(
            f"| {name} | {med[0]:.0f} | {med[1]:.0f} | {med[2]:.0f} | "
            f"{ratio[0]:.3f} | {ratio[1]:.3f} | {ratio[2]:.3f} |"
        )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
