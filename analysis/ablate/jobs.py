"""Training the grid: up to ``jobs`` runs at once, each its own ``python -m posenc_lab.train`` process (output
in its log, ``AblationDir.log``), ``threads`` torch threads each; wall and CPU seconds of every run.

A signal to the ablation (Ctrl-C's SIGINT, a scheduler's SIGTERM) is passed on to every training process,
which saves a checkpoint and exits; after a grace period a process that still runs is killed. ``Interrupted``
then carries the signal to ``ablate.main``, which says what was kept and how to continue.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from posenc_lab.checkpoints import CheckpointError, read_checkpoint
from posenc_lab.compose import quote
from posenc_lab.errors import Interrupted, signal_name
from posenc_lab.processes import spawn
from posenc_lab.rundir import RunDir

from .outdir import AblationDir
from .plan import RunSpec
from .times import Times, process_cpu_s

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


def train_command(spec: RunSpec, run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "posenc_lab.train", *spec.overrides, f"run_dir={quote(str(run_dir))}"]


def result_line(run_dir: Path) -> str:
    res = RunDir(run_dir).results() or {}
    val = res.get("val") or {}
    fig = next((f", val {k} {val[k]:.4f}" for k in ("bpb", "bpc", "ppl", "acc") if k in val), "")
    return f"{res.get('steps')} steps{fig}"


def _seconds(t: dict) -> str:
    return f"{t['wall_s']:.0f} s" + (f", CPU {t['cpu_s']:.0f} s" if t.get("cpu_s") is not None else "")


def run_jobs(
    specs: list[RunSpec],
    status: dict[str, str],
    out: AblationDir,
    jobs: int,
    threads: int | None,
    progress: Progress,
    log,
    ledger: Times,
) -> dict[str, dict]:
    """Train every spec whose status is not "reused"; {name: {status, wall_s, cpu_s}} of this invocation, each
    run's seconds also in ``ledger`` as soon as its process ends (and while it runs). RuntimeError naming a run
    that failed (with the end of its log); Interrupted on a signal, after stopping the processes."""
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    out.logs.mkdir(parents=True, exist_ok=True)
    index = {spec.name: i for i, spec in enumerate(specs, 1)}
    times: dict[str, dict] = {}
    pending = list(specs)
    running: dict[int, tuple[RunSpec, subprocess.Popen, float, str]] = {}

    def show() -> str:
        progress.running = tuple(sp.name for sp, *_ in running.values())
        return f"running: {', '.join(progress.running) or 'none'}; done {progress.done}/{len(specs)}"

    try:
        while pending or running:
            while pending and len(running) < jobs:
                spec = pending.pop(0)
                if status[spec.name] == "reused":
                    times[spec.name] = {"status": "reused", "wall_s": 0.0, "cpu_s": None}
                    progress.done += 1
                    log(f"[{index[spec.name]}/{len(specs)}] {spec.name}: reused ({result_line(out.run(spec.name))})")
                    continue
                ledger.start(spec.name, out.run(spec.name))
                with open(out.log(spec.name), "ab") as f:
                    proc = spawn(train_command(spec, out.run(spec.name)), env, f)
                running[proc.pid] = (spec, proc, time.perf_counter(), status[spec.name])
                ledger.update(spec.name, 0.0, 0.0, "running", force=True)
                log(
                    f"[{index[spec.name]}/{len(specs)}] {spec.label}: {status[spec.name].replace('ed', 'ing')} "
                    f"(pid {proc.pid}; {show()})"
                )
            finished = []
            for pid, (spec, proc, start, _) in running.items():
                got, wait_status, usage = os.wait4(pid, os.WNOHANG)
                if got:
                    proc.returncode = os.waitstatus_to_exitcode(wait_status)
                    finished.append((pid, usage))
                else:  # its seconds so far, for a kill -9 of this process
                    ledger.update(spec.name, time.perf_counter() - start, process_cpu_s(pid), "running")
            for pid, usage in finished:
                spec, proc, start, what = running.pop(pid)
                t = {"status": what, "wall_s": time.perf_counter() - start, "cpu_s": usage.ru_utime + usage.ru_stime}
                ledger.end(spec.name, t["wall_s"], t["cpu_s"], what if proc.returncode == 0 else "failed")
                if proc.returncode != 0:
                    tail = out.log(spec.name).read_text(errors="replace").strip().splitlines()[-15:]
                    raise RuntimeError(
                        f"training {spec.name} exited with code {proc.returncode}; the end of its log "
                        f"{out.log(spec.name)}:\n  " + "\n  ".join(tail)
                    )
                times[spec.name] = t
                progress.done += 1
                log(
                    f"[{index[spec.name]}/{len(specs)}] {spec.name}: {what} ({_seconds(t)}, "
                    f"{result_line(out.run(spec.name))}; {show()})"
                )
            if running and not finished:
                time.sleep(0.5)
    except Interrupted as e:
        stop_running(running, e.signum, ledger)
        raise
    finally:
        stop_running(running, signal.SIGTERM, ledger)
    return times


def stop_running(running: dict, signum: int, ledger: Times) -> None:
    """Pass ``signum`` on to the training processes still running, give them GRACE_S to save, then kill; each
    one's seconds go to ``ledger`` as "stopped" when it is reaped (``os.wait4``: its CPU seconds with it)."""
    for _, proc, *_ in running.values():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signum)
    deadline = time.monotonic() + GRACE_S
    while running:
        late = time.monotonic() >= deadline
        for pid in list(running):
            if late:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            try:
                got, wait_status, usage = os.wait4(pid, 0 if late else os.WNOHANG)
            except ChildProcessError:  # reaped just before the signal came: its CPU seconds are not known
                got, wait_status, usage = pid, 0, None
            if got:
                spec, proc, start, _ = running.pop(pid)
                proc.returncode = os.waitstatus_to_exitcode(wait_status)
                cpu = usage.ru_utime + usage.ru_stime if usage else None
                ledger.end(spec.name, time.perf_counter() - start, cpu, "stopped")
        if running:
            time.sleep(0.2)


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
