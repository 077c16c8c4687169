"""Where a training step's time goes, against the machine's matmul peak: the bare step of ``posenc-lab train``
(forward with memory, backward, clipping, the run's AdamW and schedule: ``posenc_lab/bench/overhead.py``'s
``time_bare``), timed, then run again under ``torch.profiler``: its ops' self CPU time grouped by kind, and the
step's achieved GFLOP/s beside the fp32 matmul peak the bench measures on the same machine.

    python benchmarks/profile_step.py                      # posenc=xl model=small (4 x 128, L = M = 128, batch 16)
    python benchmarks/profile_step.py --steps 10 posenc=sinusoid model=base

The floor it prints: the step's matmul FLOPs at the machine's matmul peak, and the step if every op but the
matmuls took no time; ``--reference-ms`` (a step of another program at the same sizes, e.g. the original
Transformer-XL's from ``txl_side_by_side.py``) turns each into the largest ratio over that program it allows.
The profiler times each op by the clock, so shares move by a few points with the machine's load: measure idle.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from posenc_lab import flush_denormals, keep_freed_memory, prefer_passive_openmp  # noqa: E402

prefer_passive_openmp()  # as posenc-lab train runs, before torch loads
keep_freed_memory()
flush_denormals()

import torch  # noqa: E402

#: kind -> aten op names (the rest: "other")
KINDS = {
    "matmul": "mm addmm bmm baddbmm matmul linear".split(),
    "softmax": "_softmax _softmax_backward_data".split(),
    "copies, cat, layout": "copy_ cat clone contiguous _to_copy".split(),
    "element-wise": "add add_ mul mul_ sub div gelu gelu_backward relu threshold_backward where masked_fill fill_ "
    "zero_ addcmul addcmul_ neg rsub".split(),
    "layer norm": "native_layer_norm native_layer_norm_backward".split(),
    "loss": "_log_softmax _log_softmax_backward_data nll_loss_forward nll_loss_backward".split(),
    "optimizer and clipping": "_fused_adamw_ _foreach_norm _foreach_mul_ linalg_vector_norm _foreach_add_".split(),
    "reductions": "sum amax max mean".split(),
}


def kind_of(name: str) -> str:
    return next((kind for kind, names in KINDS.items() if name.removeprefix("aten::") in names), "other")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="profile_step", description=__doc__.split("\n\n")[0])
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=5, help="timed steps, then the same steps profiled")
    p.add_argument("--top", type=int, default=15, help="ops listed by self CPU time")
    p.add_argument("--reference-ms", type=float, default=None, help="another program's step at these sizes, in ms")
    p.add_argument("overrides", nargs="*", help="Hydra overrides of posenc-lab train (default: posenc=xl model=small)")
    args = p.parse_args(argv)
    from posenc_lab.bench.flops import model_flops_per_token
    from posenc_lab.bench.overhead import _build, overrides, time_bare
    from posenc_lab.bench.probes import environment_line, matmul_peak_flops
    from posenc_lab.compose import compose

    print(environment_line())
    extra = ["posenc=xl", "model=small", "trainer.accelerator=cpu", *args.overrides]
    preset = next((o.split("=", 1)[1] for o in reversed(extra) if o.startswith("model=")), "small")
    cpu_device = torch.device("cpu")
    with tempfile.TemporaryDirectory(prefix="profile_step_") as tmp:  # the run folder the config names
        cfg = compose("train", overrides(preset, args.warmup, args.steps, str(Path(tmp) / "run"), extra))
        wall, cpu, _ = time_bare(cfg, args.warmup, args.steps, cpu_device)  # timed without the profiler
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        time_bare(cfg, args.warmup, args.steps, cpu_device, window=prof)  # the same steps again, profiled
        model = _build(cfg)[1].model  # its FLOPs
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    by_kind: dict[str, float] = {}
    for e in events:
        by_kind[kind_of(e.key)] = by_kind.get(kind_of(e.key), 0.0) + e.self_cpu_time_total
    B, L, M = int(cfg.data.batch_size), int(cfg.data.segment_len), int(cfg.model.mem_len)
    flops = model_flops_per_token(model, L, M, training=True, batch_size=B) * B * L
    threads = torch.get_num_threads()
    peak, peak_cpu = matmul_peak_flops(torch.float32), matmul_peak_flops(torch.float32, cpu_time=True)
    print(f"\n{B} x {L} tokens, memory {M}, {threads} threads: {wall * 1e3:.0f} ms a step by wall clock, "
          f"{cpu * 1e3:.0f} ms of CPU; {flops / 1e9:.1f} GFLOP of matmuls a step")  # fmt: skip
    print(f"achieved {flops / wall / 1e9:.0f} GFLOP/s by wall clock against an fp32 matmul peak of {peak / 1e9:.0f} "
          f"({flops / wall / peak:.0%}); {flops / (cpu / threads) / 1e9:.0f} by CPU time against "
          f"{peak_cpu / 1e9:.0f} ({flops / (cpu / threads) / peak_cpu:.0%})")  # fmt: skip
    print("\nself CPU time by kind of op (the profiler's, over the profiled steps):")
    for kind, t in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        print(f"  {kind:24s} {t / total:6.1%}  {t / args.steps / 1e3 / threads:8.1f} ms a step per thread")
    matmul_share = by_kind.get("matmul", 0.0) / total
    at_peak = flops / peak
    matmul_only = wall * matmul_share
    print(f"\nfloors: the matmuls at the peak {at_peak * 1e3:.0f} ms; every op but the matmuls free "
          f"{matmul_only * 1e3:.0f} ms (the step's {matmul_share:.0%}); the matmuls run at "
          f"{flops / matmul_only / peak:.0%} of the peak")  # fmt: skip
    if args.reference_ms:
        ref = args.reference_ms / 1e3
        print(f"against a {args.reference_ms:.0f} ms reference step: now {ref / wall:.2f}x; at most "
              f"{ref / matmul_only:.2f}x with every other op free, {ref / at_peak:.2f}x with the matmuls at the peak "
              "too")  # fmt: skip
    print("\ntop ops by self CPU time:")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[: args.top]:
        print(f"  {e.key:40s} {e.self_cpu_time_total / total:6.1%}  calls {e.count // args.steps:5d} a step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
