"""A pilot of a length-generalization preset: train runs, then read each on the validation split as the report reads
the test split (``posenc_lab_analysis.lengthgen.evaluate``), every test length: exact match per instance and
accuracy per answer token. Pilots choose a preset's settings on validation, never on test; the competence gate
(``competence`` of the claims file, conf/lengthgen_claims.yaml for experiment=lengthgen) is the 1x exact match.

    python benchmarks/lengthgen_pilot.py --out DIR --jobs 2 NAME='overrides ...' NAME='overrides ...' ...

Each NAME trains ``posenc-lab train <overrides> run_dir=DIR/NAME`` (one thread each, ``--jobs`` at once, as
``ablate`` runs a grid), under ``/usr/bin/time -v`` (CPU-s: user + sys of the whole training process). A row is
printed per run, and appended with the overrides to DIR/pilots.jsonl; a run already there is read again, not
trained again.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def train(out: Path, name: str, overrides: list[str]) -> dict:
    run_dir = out / name
    row = {"name": name, "overrides": overrides}
    if (run_dir / "results.json").is_file():
        return {**row, "train_cpu_s": None, "wall_s": None}
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "posenc_lab.train", *overrides, f"run_dir={run_dir}"]
    t0 = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode:
        return {**row, "failed": done.stderr[-2000:]}
    user = float(re.search(r"User time \(seconds\): ([\d.]+)", done.stderr).group(1))
    system = float(re.search(r"System time \(seconds\): ([\d.]+)", done.stderr).group(1))
    return {**row, "train_cpu_s": round(user + system, 1), "wall_s": round(time.time() - t0)}


def read(out: Path, row: dict, instances: int) -> dict:
    import torch

    from posenc_lab_analysis.lengthgen import evaluate
    from posenc_lab_analysis.runs import load_run

    torch.set_num_threads(1)
    scored = evaluate(load_run(out / row["name"]), "val", instances)
    base = min(scored)
    row["acc"] = {
        f"{n // base}x": [round(float(s.exact.mean()), 3), round(float(s.correct.mean()), 3)]
        if s.correct is not None
        else s.reason
        for n, s in sorted(scored.items())
    }
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--instances", type=int, default=64, help="val instances read per test length")
    parser.add_argument("pilots", nargs="+", metavar="NAME='overrides'")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    pilots = [(p.split("=", 1)[0], shlex.split(p.split("=", 1)[1])) for p in args.pilots]
    with ThreadPoolExecutor(args.jobs) as pool:
        trained = list(pool.map(lambda p: train(args.out, *p), pilots))
    for row in trained:
        if "failed" in row:
            print(f"| {row['name']} | failed: {row['failed'].splitlines()[-1]} |")
            continue
        row = read(args.out, row, args.instances)
        with open(args.out / "pilots.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        cells = " | ".join(
            f"{v[0]:.2f} / {v[1]:.2f}" if isinstance(v, list) else "not served" for v in row["acc"].values()
        )
        print(f"| {row['name']} | {' '.join(row['overrides'])} | {row['train_cpu_s']} | {row['wall_s']} | {cells} |")


if __name__ == "__main__":
    main()
