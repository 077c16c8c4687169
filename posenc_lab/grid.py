"""The one grid runner: trials (``Trial``, a name and the overrides of its `posenc-lab train`), each in the run
folder that ``run_folder`` names, each its own process, up to ``jobs`` at once (``processes.Pool``), until none is
left or a stop signal comes; and the ledger of their wall and CPU seconds (``Ledger``).

It serves ``posenc-lab ablate`` (``posenc_lab_analysis.ablate`` plans the cells into trials, hands them here and
reads the run folders afterwards: the analysis launches nothing) and ``posenc-lab sweep`` (``sweeps/run.py``: the
engine proposes each trial when a slot frees). ``posenc-lab train -m`` stays Hydra's multirun: Hydra's launchers
(basic, joblib, submitit on SLURM) already run the jobs of one command's overrides, each in ``hydra.sweep.dir``'s
subdir (conf/train.yaml), and a second runner for them would only repeat theirs.

Signals (``Grid.run``): while the grid runs, the first stop signal ends the loop and is passed on to every running
trial (``pass_on``, else the signal itself), which saves its step and exits; after ``grace`` seconds what still runs
is killed, and a second signal kills at once. ``Grid.run`` returns the signal (None if the grid ran out), so the
caller says what was kept and how to continue, with exit status 128 + the signal.
"""

from __future__ import annotations

import datetime
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .compose import quote
from .io import CorruptFileError, read_json, write_json
from .processes import Job, Pool

__all__ = ["RUNS", "Grid", "Job", "Launch", "Ledger", "Trial", "run_folder", "train_argv"]

RUNS = "runs"  # a grid's run folders: <out>/runs/<trial>/


@dataclass(frozen=True)
class Trial:
    """One training of a grid: ``name`` (unique in the grid: its run folder's name) and the overrides of its
    `posenc-lab train` command line (``run_dir=`` is added by whoever starts it, from ``run_folder``)."""

    name: str
    overrides: tuple[str, ...]


def run_folder(out: str | Path, name: str) -> Path:
    """The run folder of trial ``name`` of the grid in ``out``: the one rule (ablate's runs and sweep's trials)."""
    return Path(out).resolve() / RUNS / name


def train_argv(trial: Trial, run_dir: Path) -> list[str]:
    """The trial's training process: this Python's `posenc-lab train` (``-m``: what Lightning's DDP relaunches)."""
    return [sys.executable, "-m", "posenc_lab.train", *trial.overrides, f"run_dir={quote(str(run_dir))}"]


@dataclass
class Launch:
    """What the grid starts for a trial: its command line and environment, and the log its output is appended to
    (``header``: the command line first, to rerun it by hand). With a ledger: the run folder (``run_dir``) and what
    the attempt does (``what``, "trained" or "resumed": its status in the ledger when it ends well)."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    header: bool = False
    run_dir: Path | None = None
    what: str = "trained"


class Grid:
    """The trials of one invocation, up to ``jobs`` at once, and the ``ledger`` of their seconds if one is given
    (written as each starts, while it runs and when it ends: ``Ledger``)."""

    def __init__(self, jobs: int, ledger: Ledger | None = None):
        self.pool = Pool(jobs)
        self.ledger = ledger
        self._launches: dict[str, Launch] = {}

    @property
    def running(self) -> dict[str, Job]:
        return self.pool.running

    def free_slot(self) -> int | None:
        return self.pool.free_slot()

    def _start(self, launch: Launch) -> Job:
        if self.ledger is not None:
            self.ledger.start(launch.name, launch.run_dir or Path(launch.name))
        job = self.pool.start(launch.name, launch.argv, launch.env, launch.log, launch.header)
        self._launches[launch.name] = launch
        if self.ledger is not None:
            self.ledger.update(launch.name, 0.0, 0.0, "running", force=True)
        return job

    def _record(self, job: Job, status: str | None = None) -> None:
        """The attempt's seconds into the ledger: ``status``, else its launch's ``what`` or "failed"."""
        launch = self._launches.pop(job.name)
        if self.ledger is not None:
            status = status or (launch.what if job.returncode == 0 else "failed")
            self.ledger.end(job.name, job.wall_s, job.cpu_s, status)

    def _heartbeat(self) -> None:  # each running trial's seconds so far, for a kill -9 of this process
        if self.ledger is not None:
            for job in self.running.values():
                self.ledger.update(job.name, *job.so_far(), "running")

    def run(
        self,
        next_launch: Callable[[], Launch | None],
        on_end: Callable[[Job], None],
        *,
        on_start: Callable[[Job], None] = lambda job: None,
        on_tick: Callable[[], None] = lambda: None,
        on_signal: Callable[[int], None] = lambda signum: None,
        on_stop: Callable[[], None] = lambda: None,
        on_stopped: Callable[[Job], None] | None = None,
        pass_on: int | None = None,
        grace: float = 60.0,
        poll: float = 0.5,
        signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM),
    ) -> int | None:
        """Fill the pool from ``next_launch`` (called when a slot is free; None: nothing to start now) until it
        returns None with nothing running. ``on_end``: a job that ended by itself (it may raise, e.g. on a failed
        run: the other jobs are then stopped with SIGTERM and the error goes on); ``on_tick``: between polls
        (early termination). On a signal (module docstring): ``on_signal``, then ``on_stop`` (e.g. cancel SLURM
        jobs), then each job stopped goes to ``on_stopped`` (default ``on_end``). Returns the signal, or None."""
        received: list[int] = []
        pool = self.pool

        def handler(signum, frame) -> None:
            if received:  # a second one: do not wait for them
                pool.hurry = True
                return
            received.append(signum)
            on_signal(signum)

        def ended(job: Job) -> None:
            self._record(job)
            on_end(job)

        def stopped(job: Job) -> None:
            self._record(job, "stopped")
            (on_stopped or on_end)(job)

        previous = {s: signal.signal(s, handler) for s in signals}
        try:
            while not received:
                for job in pool.reap():
                    ended(job)
                self._heartbeat()
                on_tick()
                while not received and pool.free_slot() is not None:
                    launch = next_launch()
                    if launch is None:
                        break
                    on_start(self._start(launch))
                if not pool.running:
                    break
                time.sleep(poll)
        finally:
            if pool.running:  # a signal, or an error: no trial outlives the runner
                on_stop()
                signum = (pass_on or received[0]) if received else signal.SIGTERM
                pool.stop(signum, grace, stopped)
            for s, h in previous.items():
                signal.signal(s, h)
        return received[0] if received else None


# ---- the ledger ---------------------------------------------------------------------------------------------

HEARTBEAT_S = 5.0  # how often a running trial's entry is rewritten
FINISHED = ("trained", "resumed")  # the status of an attempt that ended well


class Ledger:
    """The wall and CPU seconds of every trial of a grid, across every invocation (``ablate_times.json``):

        {"<trial>": {"status": ..., "wall_s": ..., "cpu_s": ..., "attempts": N, "updated": "<ISO time>"}, ...}

    A trial's figures are the sum over its attempts: every process started for it (an interrupted one, and the
    one that continued it, each count), so they say what the run cost. ``status`` is the last attempt's:
    "trained" or "resumed" (it ended well, from the start or from a checkpoint), "stopped" (by a signal),
    "failed" (another exit), or "running" (in progress; while a trial runs its entry is rewritten every
    ``HEARTBEAT_S``, so that a kill -9 of the runner loses at most that much; the next attempt continues the
    sum). A run reused finished adds nothing. A run trained anew (``drop``, or a finished run whose folder was
    deleted by hand) starts a new sum. The file is rewritten atomically each time; only the process that holds
    the grid folder's lock writes it."""

    def __init__(self, path: Path, log=print):
        self.path = Path(path)
        self.recorded: dict[str, dict] = {}
        if self.path.is_file():
            try:
                data = read_json(self.path)
            except CorruptFileError as e:
                log(f"{e.args[0].split(';')[0]}: starting it afresh")
                data = {}
            self.recorded = {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}
        self._before: dict[str, dict] = {}  # trial -> its entry before the attempt in progress
        self._written = 0.0

    def drop(self, name: str) -> None:
        """Trial ``name`` is trained anew (``ablate.retrain``): its earlier attempts are no part of it."""
        self.recorded.pop(name, None)

    def start(self, name: str, run_dir: Path) -> None:
        """An attempt of ``name`` into ``run_dir`` is about to start its process (``update`` writes it once the
        process runs). A run that had finished and whose folder is gone (deleted by hand) starts a new sum; an
        attempt killed before it made the folder is still counted."""
        before = self.recorded.get(name, {})
        self._before[name] = {} if before.get("status") in FINISHED and not run_dir.exists() else before

    def update(self, name: str, wall_s: float, cpu_s: float | None, status: str, force: bool = False) -> None:
        """The attempt in progress of ``name`` has taken ``wall_s`` and ``cpu_s`` so far; rewritten at most every
        HEARTBEAT_S unless ``force`` (an attempt's start and end)."""
        before = self._before[name]
        cpu = [before.get("cpu_s"), cpu_s]
        self.recorded[name] = {
            "status": status,
            "wall_s": round(float(before.get("wall_s") or 0.0) + wall_s, 3),
            "cpu_s": None if all(c is None for c in cpu) else round(sum(float(c or 0.0) for c in cpu), 3),
            "attempts": int(before.get("attempts") or (1 if before else 0)) + 1,  # an entry of before the count: 1
            "updated": datetime.datetime.now().isoformat(timespec="seconds"),
        }
        if force or time.monotonic() - self._written >= HEARTBEAT_S:
            self.write()

    def end(self, name: str, wall_s: float, cpu_s: float | None, status: str) -> None:
        """The attempt of ``name`` ended with ``status``: its seconds join the trial's sum, on disk now."""
        self.update(name, wall_s, cpu_s, status, force=True)
        self._before.pop(name, None)

    def write(self) -> None:
        write_json(self.path, self.recorded)
        self._written = time.monotonic()
