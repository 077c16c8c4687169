"""Child processes that a long command supervises (the trials of a grid, ``grid.py``: the training runs of
``ablate``, the trials of ``sweep``): each in a session of its own, so that a Ctrl-C in the terminal reaches the
supervisor alone (it passes one signal on, and a run saves its step); each dying with the supervisor, even when it
is killed, so that none outlives it and holds its run directory's lock. ``Pool`` keeps up to ``jobs`` of them and
reaps each with ``os.wait4``, so that its CPU seconds are known (``Popen.poll`` would reap it without them)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child (Linux): SIGTERM when the parent dies, even by SIGKILL; the run then saves its step and stops."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn(argv: list[str], env: dict[str, str], output: IO) -> subprocess.Popen:
    """Start ``argv`` with its output into ``output``, in a session of its own, dying with this process."""
    return subprocess.Popen(
        argv, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent
    )


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds of a running process and of its children it has waited for (Linux /proc); None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime


@dataclass
class Job:
    """A process of the pool: the trial's ``name``, its job ``slot`` (0..jobs-1), its start, and once it has ended
    its exit code (negative: killed by that signal), wall and CPU seconds (None if they could not be read)."""

    name: str
    proc: subprocess.Popen
    slot: int
    start: float
    returncode: int | None = None
    wall_s: float = 0.0
    cpu_s: float | None = None

    def so_far(self) -> tuple[float, float | None]:
        """(wall, CPU) seconds of a running job (for a ledger that a kill -9 of the supervisor must not empty)."""
        return time.perf_counter() - self.start, process_cpu_s(self.proc.pid)


class Pool:
    """Up to ``jobs`` processes at once, each ``spawn``-ed with its output appended to a log file."""

    def __init__(self, jobs: int):
        self.jobs = jobs
        self.running: dict[str, Job] = {}
        self.hurry = False  # set (by a second signal): ``stop`` kills at once instead of waiting

    def free_slot(self) -> int | None:
        """The lowest free job slot (a slot keeps a device: ``sweep --devices``), or None when ``jobs`` run."""
        free = sorted(set(range(self.jobs)) - {j.slot for j in self.running.values()})
        return free[0] if free else None

    def start(self, name: str, argv: list[str], env: dict[str, str], log: Path, header: bool = False) -> Job:
        """Start trial ``name``; ``header``: first write the command line to its log, to rerun it by hand."""
        slot = self.free_slot()
        if slot is None or name in self.running:
            raise RuntimeError(f"cannot start {name}: {len(self.running)} of {self.jobs} jobs run, or it runs already")
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as f:  # the child holds its own descriptor
            if header:
                own = [f"{k}={v}" for k, v in env.items() if os.environ.get(k) != v]
                stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
                f.write(f"# {stamp}: {shlex.join(['env', *own, *argv])}\n".encode())
                f.flush()
            proc = spawn(argv, env, f)
        job = self.running[name] = Job(name, proc, slot, time.perf_counter())
        return job

    def _reaped(self, job: Job, wait: bool) -> bool:
        try:
            got, status, usage = os.wait4(job.proc.pid, 0 if wait else os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere (Popen.wait): its CPU seconds are not known
            got, status, usage = job.proc.pid, None, None
        if not got:
            return False
        code = os.waitstatus_to_exitcode(status) if status is not None else job.proc.returncode
        job.returncode = job.proc.returncode = 0 if code is None else code
        job.wall_s = time.perf_counter() - job.start
        job.cpu_s = usage.ru_utime + usage.ru_stime if usage else None
        del self.running[job.name]
        return True

    def reap(self) -> list[Job]:
        """The jobs that have ended since the last call (no waiting)."""
        return [job for job in list(self.running.values()) if self._reaped(job, wait=False)]

    def stop(self, signum: int, grace: float, on_end: Callable[[Job], None] = lambda job: None) -> None:
        """Send ``signum`` to every job's process group, give them ``grace`` seconds to save and exit (``hurry``
        cuts it short), then kill what still runs; ``on_end`` gets each job as it is reaped."""
        for job in self.running.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.proc.pid, signum)
        deadline = time.monotonic() + grace
        while self.running:
            late = self.hurry or time.monotonic() >= deadline
            for job in list(self.running.values()):
                if late:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(job.proc.pid, signal.SIGKILL)
                if self._reaped(job, wait=late):
                    on_end(job)
            if self.running:
                time.sleep(0.2)
