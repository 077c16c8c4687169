"""posenc-lab's process settings measured: OpenMP's wait policy (passive: idle threads sleep; active: they spin;
unset: libgomp's own, a bounded spin, then sleep) and glibc's malloc setting (freed memory kept, posenc-lab's
default; or malloc as glibc sets it, ``POSENC_LAB_KEEP_FREED_MEMORY=0``), for a training step of ``posenc-lab
train`` at each model size, as two jobs run it:

- **alone**: one run with torch's default threads (every core), as ``posenc-lab train`` runs on an idle machine;
- **two at a time**: two runs at once with one thread each, as ``posenc-lab ablate`` runs its grid on 2 cores
  (``ablate.jobs=2 ablate.threads=1``); the figure is the two runs' mean.

    python benchmarks/openmp_settings.py --sizes tiny small base --rounds 2

Each run is a process of its own started with the setting in its environment (as ``posenc-lab`` keeps a value the
user set), timed as ``posenc-lab bench overhead`` times ``fit``
(``posenc_lab/bench/overhead.py``). Settings are interleaved within a round and their order reversed in odd
rounds; each ratio is paired within its round. One factor at a time from posenc-lab's settings (PASSIVE, freed memory
kept): the wait policy unset and ACTIVE with the memory kept, and malloc as glibc sets it under PASSIVE. Extra
arguments are Hydra overrides (default scheme: xl).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

RESULT = "openmp_settings result: "
#: POSENC_LAB_KEEP_FREED_MEMORY: freed memory kept (posenc-lab's default) / malloc as glibc sets it
MALLOC = {"kept": "1", "glibc": "0"}
#: timed steps after 3 warm-up steps, by size: about 10 s of steps alone
STEPS = {"tiny": 50, "small": 20, "base": 4}


#: (OMP_WAIT_POLICY, malloc) of each measurement: posenc-lab's first, then one factor changed at a time
SETTINGS = [("PASSIVE", "kept"), ("unset", "kept"), ("ACTIVE", "kept"), ("PASSIVE", "glibc")]


def child(size: str, steps: int, extra: list[str]) -> None:
    """One run's figure in this process (the settings came in its environment); prints RESULT and a JSON line."""
    from posenc_lab import flush_denormals, keep_freed_memory

    # the wait policy came in the environment, or stays unset (libgomp's own, which cli.py never leaves: its
    # prefer_passive_openmp() sets PASSIVE where nothing is set)
    keep_freed_memory()
    flush_denormals()
    import torch

    from posenc_lab.bench.overhead import overrides, time_fit
    from posenc_lab.compose import compose

    with tempfile.TemporaryDirectory(prefix="openmp_settings_") as tmp:
        cfg = compose("train", overrides(size, 3, steps, str(Path(tmp) / "run"), extra))
        wall, cpu = time_fit(cfg, 3, steps)[:2]
    print(RESULT + json.dumps({"wall_s": wall, "cpu_s": cpu, "threads": torch.get_num_threads()}), flush=True)


def start(size: str, steps: int, policy: str, malloc: str, threads: int | None, extra: list[str]):
    env = {**os.environ, "OMP_WAIT_POLICY": policy, "POSENC_LAB_KEEP_FREED_MEMORY": MALLOC[malloc]}
    if policy == "unset":
        del env["OMP_WAIT_POLICY"]
    for name in ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_"):  # as a fresh shell: only the setting decides
        env.pop(name, None)
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    command = [sys.executable, __file__, "--child", size, "--steps", str(steps), *extra]
    return subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result(process) -> dict:
    out, err = process.communicate()
    lines = [line for line in out.splitlines() if line.startswith(RESULT)]
    if process.returncode != 0 or not lines:
        raise SystemExit(f"openmp_settings: a run failed:\n{err[-3000:]}")
    return json.loads(lines[-1][len(RESULT) :])


def measure(size: str, job: str, policy: str, malloc: str, extra: list[str]) -> float:
    """Seconds per step: alone (torch's threads), or the mean of two runs at once with one thread each."""
    steps = STEPS[size]
    if job == "alone":
        return result(start(size, steps, policy, malloc, None, extra))["wall_s"]
    pair = [start(size, steps, policy, malloc, 1, extra) for _ in range(2)]
    return statistics.mean(result(p)["wall_s"] for p in pair)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="openmp_settings", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", choices=list(STEPS), default=list(STEPS))
    p.add_argument("--jobs", nargs="+", choices=["alone", "two"], default=["alone", "two"])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--first-round", type=int, default=1, help="the first round's number (even: reversed order)")
    p.add_argument("--child", choices=list(STEPS), help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*", help="Hydra overrides of posenc-lab train (default: posenc=xl)")
    args = p.parse_args(argv)
    extra = ["posenc=xl", "trainer.accelerator=cpu", *args.overrides]
    if args.child:
        child(args.child, args.steps, extra)
        return 0
    if args.rounds < 1:
        print(f"openmp_settings: --rounds {args.rounds}: at least 1", file=sys.stderr)
        return 2
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')}  {os.cpu_count()} CPUs  load avg {load}  overrides: {extra}")
    rows = []
    for n in range(args.first_round - 1, args.first_round - 1 + args.rounds):
        for size, job in itertools.product(args.sizes, args.jobs):
            ms = {}
            for policy, malloc in SETTINGS if n % 2 == 0 else SETTINGS[::-1]:
                ms[policy, malloc] = measure(size, job, policy, malloc, extra) * 1e3
                print(f"round {n + 1}  {size:5s} {job:5s}  OMP_WAIT_POLICY={policy:7s} malloc {malloc:5s}  "
                      f"{ms[policy, malloc]:8.1f} ms a step", flush=True)  # fmt: skip
            base = ms["PASSIVE", "kept"]  # posenc-lab's settings
            rows += [
                {"round": n + 1, "size": size, "job": job, "policy": policy, "malloc": malloc, "ms": v,
                 "vs_posenc_lab_settings": v / base}
                for (policy, malloc), v in ms.items()
            ]  # fmt: skip
    import pandas as pd

    df = pd.DataFrame(rows)
    summary = (
        df.groupby(["size", "job", "policy", "malloc"], sort=False)
        .agg(ms_median=("ms", "median"), ratio_median=("vs_posenc_lab_settings", "median"),
             ratio_low=("vs_posenc_lab_settings", "min"), ratio_high=("vs_posenc_lab_settings", "max"))
        .round(3)
    )  # fmt: skip
    print()
    print("ms a step (median over rounds) and its ratio to posenc-lab's settings (PASSIVE, memory kept) paired by")
    print("round: below 1 is faster than posenc-lab's settings")
    print(summary.to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
