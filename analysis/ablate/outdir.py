"""An ablation's output folder (``ablate.out``): the one place that names its files, as ``posenc_lab.rundir.RunDir``
does for a run, and its lock.

    <ablate.out>/runs/<run>/          one `posenc-lab train` run directory each (``plan.RunSpec.name``)
    <ablate.out>/logs/<run>.log       the output of each run's training process
    <ablate.out>/report/              report.md, its CSVs and PNGs
    <ablate.out>/ablate_times.json    wall and CPU seconds of every run
    <ablate.out>/.lock                the process writing the folder (``posenc_lab.rundir.RunLock``): a second
                                      ``posenc-lab ablate`` into the same folder is refused while the first runs
"""

from __future__ import annotations

import os
from pathlib import Path

from posenc_lab.io import path_problem
from posenc_lab.rundir import RunLock

KEY = "ablate.out"


class AblationDir:
    RUNS = "runs"
    LOGS = "logs"
    REPORT = "report"
    TIMES = "ablate_times.json"

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).resolve()

    def __repr__(self) -> str:
        return f"AblationDir({str(self.path)!r})"

    @property
    def runs(self) -> Path:
        return self.path / self.RUNS

    def run(self, name: str) -> Path:
        """The run directory of the grid's run ``name``."""
        return self.runs / name

    @property
    def logs(self) -> Path:
        return self.path / self.LOGS

    def log(self, name: str) -> Path:
        """The training log of run ``name``."""
        return self.logs / f"{name}.log"

    @property
    def report(self) -> Path:
        return self.path / self.REPORT

    @property
    def times(self) -> Path:
        return self.path / self.TIMES

    def problem(self) -> str | None:
        """Why the folder cannot be written (a file in its place, no permission, ...), in one line; None if it can."""
        return path_problem(self.path, KEY)

    def lock(self) -> RunLock:
        """``with out.lock():`` -- this process alone writes the folder; a second one is refused in one line."""
        return RunLock(self.path, key=KEY)
