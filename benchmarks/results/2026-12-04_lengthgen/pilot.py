"""One sizing pilot of the length-generalization tasks: train one run, then its exact match by test length.

    python docs/perf/2026-12-04_lengthgen/pilot.py NAME [training overrides...]

Trains ``posenc-lab train experiment=lengthgen <overrides> run_dir=$PILOTS/NAME`` under ``/usr/bin/time -v``
(CPU-s = user + sys of the whole training process), then evaluates the run on the first ``--instances`` val
instances at each test length as the report does (``analysis.lengthgen.evaluate``: val, since the pilots tune and
the report judges on test). Prints one row of PILOTS.md and appends it, with the overrides, to
$PILOTS/pilots.jsonl. $PILOTS: /tmp/lengthgen_pilots unless set.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from posenc_lab_analysis.lengthgen import evaluate
from posenc_lab_analysis.runs import load_run


def cpu_seconds(stderr: str) -> float:
    """user + sys from /usr/bin/time -v's report."""
    user = float(re.search(r"User time \(seconds\): ([\d.]+)", stderr).group(1))
    system = float(re.search(r"System time \(seconds\): ([\d.]+)", stderr).group(1))
    return user + system


def train_curve(run_dir: Path) -> str:
    """The answer tokens' train accuracy at each quarter of training (the mean of the logged steps in it)."""
    m = pd.read_csv(run_dir / "metrics.csv")
    m = m[["step", "train/acc"]].dropna()
    quarter = (4 * m["step"] / (m["step"].max() + 1)).astype(int)
    return " ".join(f"{v:.2f}" for v in m.groupby(quarter)["train/acc"].mean())


def main(argv: list[str]) -> None:
    instances = 64
    if argv and argv[0].startswith("--instances="):
        instances = int(argv.pop(0).split("=", 1)[1])
    name, overrides = argv[0], argv[1:]
    root = Path(os.environ.get("PILOTS", "/tmp/lengthgen_pilots"))
    run_dir = root / name
    cmd = ["/usr/bin/time", "-v", "posenc-lab", "train", "experiment=lengthgen", *overrides, f"run_dir={run_dir}"]
    t0 = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.time() - t0
    if done.returncode:
        sys.exit(f"pilot {name} failed:\n{done.stderr[-3000:]}")
    train_cpu = cpu_seconds(done.stderr)
    torch.set_num_threads(1)
    c0 = time.process_time()
    scored = evaluate(load_run(run_dir), "val", instances)
    eval_cpu = time.process_time() - c0
    curve = train_curve(run_dir)
    base = min(scored)
    acc = {
        f"{n // base}x": (round(float(s.exact.mean()), 3), round(float(s.correct.mean()), 3))
        if s.correct is not None
        else s.reason
        for n, s in sorted(scored.items())
    }
    row = dict(
        name=name,
        overrides=overrides,
        train_cpu_s=round(train_cpu, 1),
        wall_s=round(wall),
        eval_cpu_s=round(eval_cpu, 1),
    )
    row["acc"] = acc  # factor -> (exact match per instance, per answer token)
    row["train_acc"] = curve
    with open(root / "pilots.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    cells = " | ".join(f"{v[0]:.2f} / {v[1]:.2f}" if isinstance(v, tuple) else "not served" for v in acc.values())
    print(f"| {name} | {' '.join(overrides)} | {train_cpu:.0f} | {cells} | {curve} |")


if __name__ == "__main__":
    main(sys.argv[1:])
