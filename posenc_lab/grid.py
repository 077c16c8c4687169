"""The one grid runner: trials (``Trial``, a name and the overrides of its `posenc-lab train`), each in the run
folder that ``rundir.run_folder`` names, each its own process, up to ``jobs`` at once (``processes.Pool``), until
none is left or a stop signal comes; and the grid's one state file (``Ledger``, ``<out>/grid.json``): every trial, its
overrides, status and wall and CPU seconds, and what the command that runs the grid keeps beside them.

    <out>/grid.json          the state (``ledger_file``)
    <out>/runs/<trial>/      each trial's run folder (``rundir.run_folder``: also train's, train -m's and eval's rule)
    <out>/logs/<trial>.log   each trial's output

It serves ``posenc-lab ablate`` (``posenc_lab.ablate`` plans the cells into trials, hands them here and
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .compose import quote
from .io import CorruptFileError, read_json, write_json
from .processes import Job, Pool

__all__ = [
    "LEDGER",
    "LOGS",
    "Grid",
    "Job",
    "Launch",
    "Ledger",
    "Trial",
    "ledger_file",
    "log_file",
    "train_argv",
]

LOGS = "logs"  # its trials' output: <out>/logs/<trial>.log


@dataclass(frozen=True)
class Trial:
    """One training of a grid: ``name`` (unique in the grid: its run folder's name) and the overrides of its
    `posenc-lab train` command line (``run_dir=`` is added by whoever starts it, from ``rundir.run_folder``)."""

    name: str
    overrides: tuple[str, ...]


def log_file(out: str | Path, name: str) -> Path:
    """The log of trial ``name`` of the grid in ``out``: its process's output (``Launch.log``)."""
    return Path(out).resolve() / LOGS / f"{name}.log"


def train_argv(trial: Trial, run_dir: Path) -> list[str]:
    """The trial's training process: this Python's `posenc-lab train` (``-m``: what Lightning's DDP relaunches)."""
    return [sys.executable, "-m", "posenc_lab.train", *trial.overrides, f"run_dir={quote(str(run_dir))}"]


@dataclass
class Launch:
    """What the grid starts for a trial: its command line and environment, and the log its output is appended to
    (``header``: the command line first, to rerun it by hand). With a ledger: the run folder (``run_dir``), the
    trial's overrides (``overrides``, recorded) and what the attempt does (``what``, "trained" or "resumed": its
    status in the ledger when it ends well)."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    header: bool = False
    run_dir: Path | None = None
    what: str = "trained"
    overrides: Sequence[str] = ()


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
            self.ledger.start(launch.name, launch.run_dir or Path(launch.name), launch.overrides)
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


# ---- the ledger: the grid's one state file ---------------------------------------------------------------

LEDGER = "grid.json"  # a grid's state: <out>/grid.json, beside its run folders <out>/runs/<trial>/
FORMAT = 2  # 1: ablate_times.json, the trials' entries alone at the top level (read as they are)
HEARTBEAT_S = 5.0  # how often a running trial's entry is rewritten
FINISHED = ("trained", "resumed")  # the status of an attempt that ended well


def ledger_file(out: str | Path) -> Path:
    """The state file of the grid in ``out``: the one rule, as ``rundir.run_folder`` is for its trials' folders."""
    return Path(out).resolve() / LEDGER


class Ledger:
    """The one state file of a grid (``<out>/grid.json``, ``ledger_file``), across every invocation:

        {"format": 2,
         "trials": {"<trial>": {"status": ..., "wall_s": ..., "cpu_s": ..., "attempts": N, "updated": "<ISO time>",
                                "run_dir": ..., "overrides": [...], <what the command that runs the grid adds>}},
         <its sections>}

    A trial's seconds are the sum over its attempts: every process started for it (an interrupted one, and the
    one that continued it, each count), so they say what the run cost. ``status`` is the last attempt's:
    "trained" or "resumed" (it ended well, from the start or from a checkpoint), "stopped" (by a signal),
    "failed" (another exit), or "running" (in progress; while a trial runs its entry is rewritten every
    ``HEARTBEAT_S``, so that a kill -9 of the runner loses at most that much; the next attempt continues the
    sum). A run reused finished adds nothing. A run trained anew (``drop``, or a finished run whose folder was
    deleted by hand) starts a new sum. The caller's own keys of an entry (``posenc-lab sweep``'s: the trial's
    parameters, its objective value, the engine's proposal state) are kept as they are, and so are the file's
    ``sections``, one per command, which also says whose grid the folder is: ``sweep`` (posenc-lab sweep's: its id,
    seed, file and overrides; ``sweeps/state.py``) or ``ablate`` (posenc-lab ablate's mark: made_by, format,
    created, adopted; ``ablate/outdir.py``). The file is rewritten atomically each time; only the process that
    holds the grid folder's lock writes it.

    A damaged file is started afresh in one line (``log``), or with ``remedy`` refused (CorruptFileError naming
    it and the remedy): a sweep's state cannot be guessed again, nor can whose folder it is (ablate's mark)."""

    def __init__(self, path: Path, log=print, remedy: str | None = None):
        self.path = Path(path)
        self.recorded: dict[str, dict] = {}  # the trials' entries, by name, in the order they were first recorded
        self.sections: dict[str, Any] = {}
        if self.path.is_file():
            try:
                data = read_json(self.path, **({"remedy": remedy} if remedy else {}))
            except CorruptFileError as e:
                if remedy:
                    raise
                log(f"{e.args[0].split(';')[0]}: starting it afresh")
                data = {}
            self.read(data)
        self._before: dict[str, dict] = {}  # trial -> its entry before the attempt in progress
        self._written = 0.0

    def read(self, data: Any) -> None:
        """The entries and sections of ``data``: this format, or format 1's entries alone."""
        if not isinstance(data, dict):
            data = {}
        trials = data.get("trials") if data.get("format") == FORMAT else data
        self.recorded = {k: v for k, v in (trials or {}).items() if isinstance(v, dict)}
        if data.get("format") == FORMAT:
            self.sections = {k: v for k, v in data.items() if k not in ("format", "trials")}

    def drop(self, name: str) -> None:
        """Trial ``name`` is trained anew (``ablate.retrain``): its earlier attempts are no part of it."""
        self.recorded.pop(name, None)

    def start(self, name: str, run_dir: Path, overrides: Sequence[str] = ()) -> None:
        """An attempt of ``name`` into ``run_dir`` with ``overrides`` is about to start its process (``update``
        writes it once the process runs). A run that had finished and whose folder is gone (deleted by hand)
        starts a new sum; an attempt killed before it made the folder is still counted."""
        before = self.recorded.get(name, {})
        new_sum = before.get("status") in FINISHED and not run_dir.exists()
        kept = {} if new_sum else {k: before[k] for k in ("wall_s", "cpu_s", "attempts") if k in before}
        self._before[name] = {**kept, "counted": "status" in before and not new_sum}  # an attempt ran before
        entry = self.recorded.setdefault(name, {})
        entry.update(run_dir=str(run_dir), overrides=list(overrides))

    def update(self, name: str, wall_s: float, cpu_s: float | None, status: str, force: bool = False) -> None:
        """The attempt in progress of ``name`` has taken ``wall_s`` and ``cpu_s`` so far; rewritten at most every
        HEARTBEAT_S unless ``force`` (an attempt's start and end)."""
        before = self._before[name]
        cpu = [before.get("cpu_s"), cpu_s]
        earlier = int(before.get("attempts") or (1 if before["counted"] else 0))  # an entry of before the count: 1
        self.recorded.setdefault(name, {}).update(
            status=status,
            wall_s=round(float(before.get("wall_s") or 0.0) + wall_s, 3),
            cpu_s=None if all(c is None for c in cpu) else round(sum(float(c or 0.0) for c in cpu), 3),
            attempts=earlier + 1,
            updated=datetime.datetime.now().isoformat(timespec="seconds"),
        )
        if force or time.monotonic() - self._written >= HEARTBEAT_S:
            self.write()

    def end(self, name: str, wall_s: float, cpu_s: float | None, status: str) -> None:
        """The attempt of ``name`` ended with ``status``: its seconds join the trial's sum, on disk now."""
        self.update(name, wall_s, cpu_s, status, force=True)
        self._before.pop(name, None)

    def write(self) -> None:
        write_json(self.path, {"format": FORMAT, "trials": self.recorded, **self.sections})
        self._written = time.monotonic()
