"""Training the grid: the plan's runs handed to the one grid runner (``posenc_lab.grid``), up to ``jobs`` at
once, each its own ``python -m posenc_lab.train`` process (output in its log, ``AblationDir.log``), ``threads``
torch threads each; the progress lines, and what to say after a stop.

A signal to the ablation (Ctrl-C's SIGINT, a scheduler's SIGTERM) is passed on by the runner to every training
process, which saves a checkpoint and exits; after a grace period a process that still runs is killed.
``Interrupted`` then carries the signal to ``ablate.main``, which says what was kept and how to continue.
"""

from __future__ import annotations

import os
import shlex
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..checkpoints import CheckpointError, read_checkpoint
from ..compose import quote
from ..errors import Interrupted, signal_name
from ..grid import Grid, Job, Launch, Ledger, train_argv
from ..rundir import RunDir
from .outdir import AblationDir
from .plan import RunSpec

GRACE_S = 60  # a training process gets this long to save its checkpoint after the signal


def raise_interrupted(signum, frame) -> None:
    """The ablation's signal handler: posenc_lab's one Interrupted, its number ``signum`` (exit 128 + it)."""
    raise Interrupted(signum, f"stopped by {signal_name(signum)}")


@dataclass
class Progress:
    """Where the job is, for the progress lines and for the message after a signal."""

    total: int
    stage: str = "planning"
    running: tuple[str, ...] = ()
    done: int = 0


def result_line(run_dir: Path) -> str:
    res = RunDir(run_dir).results() or {}
    val = res.get("val") or {}
    fig = next((f", val {k} {val[k]:.4f}" for k in ("bpb", "bpc", "ppl", "acc") if k in val), "")
    return f"{res.get('steps')} steps{fig}"


def _seconds(t: dict) -> str:
    return f"{t['wall_s']:.0f} s" + (f", CPU {t['cpu_s']:.0f} s" if t.get("cpu_s") is not None else "")


class RunFailed(RuntimeError):
    """A training process of the grid ended with ``returncode`` (negative: killed by that signal)."""

    def __init__(self, name: str, returncode: int, message: str):
        super().__init__(message)
        self.name, self.returncode = name, returncode


def failed_advice(error: RunFailed, finished: int, overrides: Sequence[str], out: AblationDir) -> str:
    """What to do after a run of the grid failed, in one line. A run killed by a signal (the out-of-memory killer,
    a kill by hand) continues from its checkpoint: the same command makes progress. A run that exited with an error
    meets it again when it is rerun, so the command is given for after its cause (its log's end) is fixed."""
    kept = f"{finished} finished run(s) are kept in {out.runs} and reused; " if finished else "no run finished; "
    if error.returncode < 0:
        step = checkpoint_step(out.run(error.name))
        where = f"its checkpoint at step {step}" if step is not None else "the start (it saved no checkpoint)"
        return f"{kept}{error.name} trains again from {where}: continue with: {continue_command(overrides, out)}"
    return f"{kept}once what its log says is fixed, continue with: {continue_command(overrides, out)}"


def run_jobs(
    specs: list[RunSpec],
    status: dict[str, str],
    out: AblationDir,
    jobs: int,
    threads: int | None,
    progress: Progress,
    log,
    ledger: Ledger,
) -> dict[str, dict]:
    """Hand every spec whose status is not "reused" to the grid runner (``posenc_lab.grid.Grid``); {name: {status,
    wall_s, cpu_s}} of this invocation, each run's seconds also in ``ledger`` (the runner writes it as each
    process starts, runs and ends). RunFailed naming a run that failed (with the end of its log); Interrupted
    on a signal, after the runner has stopped the processes."""
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    index = {spec.name: i for i, spec in enumerate(specs, 1)}
    by_name = {spec.name: spec for spec in specs}
    times: dict[str, dict] = {}
    pending = list(specs)
    runner = Grid(jobs, ledger)

    def show() -> str:
        progress.running = tuple(runner.running)
        return f"running: {', '.join(progress.running) or 'none'}; done {progress.done}/{len(specs)}"

    def next_launch() -> Launch | None:
        while pending:
            spec = pending.pop(0)
            if status[spec.name] == "reused":
                times[spec.name] = {"status": "reused", "wall_s": 0.0, "cpu_s": None}
                progress.done += 1
                log(f"[{index[spec.name]}/{len(specs)}] {spec.name}: reused ({result_line(out.run(spec.name))})")
                continue
            run_dir = out.run(spec.name)
            argv = train_argv(spec.trial, run_dir)
            what, output = status[spec.name], out.log(spec.name)
            return Launch(spec.name, argv, env, output, run_dir=run_dir, what=what, overrides=spec.trial.overrides)
        return None

    def started(job: Job) -> None:
        what = status[job.name].replace("ed", "ing")
        log(f"[{index[job.name]}/{len(specs)}] {by_name[job.name].label}: {what} (pid {job.proc.pid}; {show()})")

    def ended(job: Job) -> None:
        if job.returncode != 0:
            tail = out.log(job.name).read_text(errors="replace").strip().splitlines()[-15:]
            how = f"was killed by {signal_name(-job.returncode)}" if job.returncode < 0 else "exited"
            raise RunFailed(
                job.name,
                job.returncode,
                f"training {job.name} {how} (code {job.returncode}); the end of its log "
                f"{out.log(job.name)}:\n  " + "\n  ".join(tail),
            )
        t = times[job.name] = {"status": status[job.name], "wall_s": job.wall_s, "cpu_s": job.cpu_s}
        progress.done += 1
        shown = f"{_seconds(t)}, {result_line(out.run(job.name))}; {show()}"
        log(f"[{index[job.name]}/{len(specs)}] {job.name}: {t['status']} ({shown})")

    out.logs.mkdir(parents=True, exist_ok=True)
    signum = runner.run(next_launch, ended, on_start=started, on_stopped=lambda job: None, grace=GRACE_S)
    if signum is not None:
        raise Interrupted(signum, f"stopped by {signal_name(signum)}")
    return times


def checkpoint_step(run_dir: Path) -> int | None:
    last = RunDir(run_dir).newest_checkpoint()
    if last is None:
        return None
    try:
        return int(read_checkpoint(last).get("global_step", 0))
    except CheckpointError:  # a checkpoint cut short by the stop: that run trains again from its last good one
        return None


def continue_command(overrides: Sequence[str], out: AblationDir | Path) -> str:
    """The command that continues this job from anywhere: the same overrides, the output folder made absolute,
    and no retrain (which would throw away the runs it is meant to continue)."""
    keep = [o for o in overrides if not o.startswith(("ablate.out=", "ablate.retrain="))]
    path = out.path if isinstance(out, AblationDir) else Path(out)
    return "posenc-lab ablate " + shlex.join([*keep, f"ablate.out={quote(str(path))}"])


def interrupted_message(signum: int, progress: Progress, specs: Sequence[RunSpec], out: AblationDir, overrides) -> str:
    finished = [s.name for s in specs if RunDir(out.run(s.name)).finished]
    name = signal.Signals(signum).name + (" (Ctrl-C)" if signum == signal.SIGINT else "")
    lines = [
        f"posenc-lab ablate: stopped by {name} during {progress.stage}"
        + (f" of {', '.join(progress.running)}" if progress.running else "")
        + "."
    ]
    lines.append(
        f"Kept: {len(finished)} of {len(specs)} runs finished in {out.runs}"
        + (" (each reused when you continue)." if finished else ".")
    )
    for name in progress.running:
        if progress.stage == "training" and name not in finished:
            step = checkpoint_step(out.run(name))
            lines.append(
                f"  {name}: "
                + (
                    f"continues from its checkpoint at step {step}."
                    if step is not None
                    else "no checkpoint yet; it trains again from the start."
                )
            )
    if progress.stage.startswith("analysis"):
        lines.append(
            f"The new report is not complete ({out.report} is left as it was); it is written when you continue."
        )
    lines.append(f"Continue with: {continue_command(overrides, out)}")
    return "\n".join(lines)
