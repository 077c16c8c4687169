"""SLURM requeue on a real one-node SLURM (the daemons of tests/test_slurm.py): the signal SLURM sends before a
job's time limit (``#SBATCH --signal=SIGUSR1@90``, Lightning's auto-requeue signal) makes train save at the end
of the step, requeue the job and exit; the requeued job resumes from that checkpoint and finishes."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time

import pytest

from tests.helpers_train import subprocess_env, tiny
from tests.test_slurm import slurm  # noqa: F401 - the fixture: SLURM's daemons for this module


def _squeue(env, job: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], env=env, capture_output=True, text=True).stdout


@pytest.mark.slow
def test_sigusr1_saves_requeues_and_the_requeued_job_finishes_from_that_checkpoint(slurm, tmp_path):  # noqa: F811
    run, steps = tmp_path / "run", 3000
    args = tiny(run, tmp_path / "cache", "checkpoint_every=100000", "trainer=cpu", steps=steps)  # no periodic save
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH --job-name=posenc-requeue\n#SBATCH --ntasks=1\n#SBATCH --cpus-per-task=1\n"
        f"#SBATCH --requeue\n#SBATCH --open-mode=append\n#SBATCH --output={tmp_path}/job.out\n"
        'echo "start ${SLURM_RESTART_COUNT:-0}"\n'
        f"srun {shlex.quote(sys.executable)} -m posenc_lab.train {shlex.join(map(str, args))}\n"
    )
    env = subprocess_env(**{k: v for k, v in slurm.items() if k in ("SLURM_CONF", "PATH")})
    submitted = subprocess.run(
        ["sbatch", "--parsable", str(script)], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]

    deadline = time.monotonic() + 300
    while not ((run / "train.log").is_file() and "run dir " in (run / "train.log").read_text()):
        assert time.monotonic() < deadline, (tmp_path / "job.out").read_text()[-3000:]
        time.sleep(0.5)
    time.sleep(2)  # training
    subprocess.run(["scancel", "--signal=USR1", job], env=env, check=True)

    deadline = time.monotonic() + 600
    while "PENDING" not in _squeue(env, job):  # requeued, held by SLURM's requeue delay (minutes): start it now
        assert time.monotonic() < deadline, (tmp_path / "job.out").read_text()[-5000:]
        time.sleep(0.5)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], env=env, check=True, capture_output=True)
    while not (run / "results.json").is_file() or _squeue(env, job).strip():
        assert time.monotonic() < deadline, (tmp_path / "job.out").read_text()[-5000:]
        time.sleep(1)
    out = (tmp_path / "job.out").read_text()
    stop = [line for line in out.splitlines() if line.startswith("posenc-lab train: stopped by SIGUSR1 at step ")]
    assert len(stop) == 1, out[-5000:]
    step = int(stop[0].split(" at step ")[1].split(";")[0])
    assert f"saved {run}/checkpoints/last.ckpt; SLURM job {job} is requeued and continues from there" in stop[0]
    assert "start 0" in out and "start 1" in out  # the script ran twice: the second time as the requeued job
    results = json.loads((run / "results.json").read_text())
    assert 0 < step < steps and results["steps"] == steps
    assert results["resumed_from"] == str(run / "checkpoints" / "last.ckpt")
    assert (run / f"metrics.until_step{step}.csv").is_file()  # the first part's log, up to the saved step
    assert [(s["from_step"], s["to_step"]) for s in results["schedule"]] == [(0, step), (step, steps)]


@pytest.mark.slow
def test_submitits_signal_saves_first_then_submitit_requeues_and_the_job_finishes(slurm, tmp_path):  # noqa: F811
    """hydra/launcher=slurm: submitit asks for its signal (USR2) before the time limit and requeues the job on
    it; train saves at the end of the step first (submitit alone would exit mid-step)."""
    sweep, steps = tmp_path / "sweep", 3000
    overrides = [
        o for o in tiny(sweep, tmp_path / "cache", "checkpoint_every=100000", steps=steps) if "run_dir=" not in o
    ]
    cmd = [
        sys.executable, "-m", "posenc_lab.train", "-m", "hydra/launcher=slurm", "hydra.launcher.partition=debug",
        "hydra.launcher.gpus_per_node=null", "hydra.launcher.cpus_per_task=1", "hydra.launcher.timeout_min=10",
        "trainer=cpu", f"hydra.sweep.dir={sweep}", *overrides, "posenc=xl",
    ]  # fmt: skip
    env = subprocess_env(**{k: v for k, v in slurm.items() if k in ("SLURM_CONF", "PATH")})
    launcher = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run = sweep / "0_xl_recall"
    deadline = time.monotonic() + 300
    while not ((run / "train.log").is_file() and "run dir " in (run / "train.log").read_text()):
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.stdout.read()[-3000:]
        time.sleep(0.5)
    time.sleep(2)
    job = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True).stdout.split()[0]
    subprocess.run(["scancel", "--signal=USR2", job], env=env, check=True)
    deadline = time.monotonic() + 600
    while "PENDING" not in _squeue(env, job):
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.stdout.read()[-3000:]
        time.sleep(0.5)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], env=env, check=True, capture_output=True)
    assert launcher.wait(timeout=600) == 0, launcher.stdout.read()[-3000:]

    logs = "".join(p.read_text() for p in (sweep / ".submitit").rglob("*_log.err"))
    stop = [line for line in logs.splitlines() if line.startswith("posenc-lab train: stopped by SIGUSR2 at step ")]
    assert len(stop) == 1 and "; submitit requeues the job, which continues from there" in stop[0], logs[-3000:]
    step = int(stop[0].split(" at step ")[1].split(";")[0])
    results = json.loads((run / "results.json").read_text())
    assert 0 < step < steps and results["steps"] == steps
    assert results["resumed_from"] == str(run / "checkpoints" / "last.ckpt")
    assert [(s["from_step"], s["to_step"]) for s in results["schedule"]] == [(0, step), (step, steps)]
