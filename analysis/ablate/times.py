"""``ablate_times.json``: the wall and CPU seconds of every run of an ablation, across every invocation.

    {"<run>": {"status": ..., "wall_s": ..., "cpu_s": ..., "attempts": N, "updated": "<ISO time>"}, ...}

A run's figures are the sum over its attempts: every training process ablate started for it (an interrupted one,
and the one that continued it, each count), so they say what the run cost. ``status`` is the last attempt's:
"trained" or "resumed" (it ended well, from the start or from a checkpoint), "stopped" (by a signal), "failed"
(another exit), or "running" (in progress; while a run trains its entry is rewritten every ``HEARTBEAT_S``, so
that a kill -9 of ablate itself loses at most that much; the next attempt continues the sum). A run reused
finished adds nothing. A run trained anew (``ablate.retrain``, or a finished run whose directory was deleted by
hand) starts a new sum. The file is rewritten atomically each time; only the ablate that holds the folder's lock
writes it.
"""

from __future__ import annotations

import datetime
import os
import time
from pathlib import Path

from posenc_lab.io import CorruptFileError, read_json, write_json

HEARTBEAT_S = 5.0  # how often a running run's entry is rewritten
FINISHED = ("trained", "resumed")  # the status of an attempt that ended well


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds of a running process and of its children it has waited for (Linux /proc); None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime


class Times:
    """This ablation's ``ablate_times.json``, kept in step with its training processes."""

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
        self._before: dict[str, dict] = {}  # run -> its entry before the attempt in progress
        self._written = 0.0

    def drop(self, name: str) -> None:
        """Run ``name`` is trained anew (``ablate.retrain``): its earlier attempts are no part of it."""
        self.recorded.pop(name, None)

    def start(self, name: str, run_dir: Path) -> None:
        """An attempt of run ``name`` into ``run_dir`` is about to start its process (``update`` writes it once the
        process runs). A run that had finished and whose directory is gone (deleted by hand) starts a new sum; an
        attempt killed before it made the directory is still counted."""
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
        """The attempt of ``name`` ended with ``status``: its seconds join the run's sum, on disk now."""
        self.update(name, wall_s, cpu_s, status, force=True)
        self._before.pop(name, None)

    def write(self) -> None:
        write_json(self.path, self.recorded)
        self._written = time.monotonic()
