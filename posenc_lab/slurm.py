"""The signals that stop a training run inside a SLURM job, and its requeue (docs/CLUSTERS.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import warnings

from lightning.fabric.plugins.environments import SLURMEnvironment

from .errors import STOP_SIGNALS


def stop_signals() -> tuple[int, ...]:
    """errors.STOP_SIGNALS and, inside a SLURM job, the signals after which it is requeued: SIGUSR1 (Lightning's SLURM
    auto-requeue signal, ``#SBATCH --signal=SIGUSR1@90``; handled here, so that Lightning's own handler, a save from
    inside the signal handler, mid-step, into hpc_ckpt_N.ckpt, stays unset) and submitit's (hydra/launcher=slurm).
    See docs/CLUSTERS.md."""
    requeue = (signal.SIGUSR1,) if in_slurm_job() else ()
    return tuple(dict.fromkeys(STOP_SIGNALS + requeue + tuple(s for s in (submitit_signal(),) if s)))


def submitit_signal() -> int | None:
    """The signal the submitit launcher requeues its jobs on (USR2, or $SUBMITIT_PREEMPT_SIGNAL), in a job it
    started; else None."""
    if os.environ.get("SUBMITIT_EXECUTOR") != "slurm":
        return None
    return getattr(signal, f"SIG{os.environ.get('SUBMITIT_PREEMPT_SIGNAL', 'USR2')}", None)


def in_slurm_job() -> bool:
    with warnings.catch_warnings():  # detect() warns when srun is installed but not used: Lightning says it later
        warnings.simplefilter("ignore")
        return SLURMEnvironment.detect()


def requeue() -> str:
    """Requeue this SLURM job (``scontrol requeue``, as Lightning's auto-requeue does); what happened, in words."""
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    job = f"{array}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array else os.environ.get("SLURM_JOB_ID", "?")
    try:
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"requeueing SLURM job {job} failed ({e}): resubmit it"
    if done.returncode:
        return f"requeueing SLURM job {job} failed ({done.stderr.strip()}): resubmit it"
    return f"SLURM job {job} is requeued and continues from there"
