"""An ablation's output folder (``ablate.out``): the one place that names its files, as ``posenc_lab.rundir.RunDir``
does for a run, and its lock.

    <ablate.out>/.ablate.json         the mark of a folder `posenc-lab ablate` made (written when it first takes it)
    <ablate.out>/runs/<run>/          one `posenc-lab train` run directory each (``plan.RunSpec.name``)
    <ablate.out>/logs/<run>.log       the output of each run's training process
    <ablate.out>/report/              report.md, its CSVs and PNGs
    <ablate.out>/grid.json            the grid's one state file: every run, its overrides, status and wall and CPU
                                      seconds (``posenc_lab.grid.Ledger``; an earlier version's ablate_times.json
                                      is read into it once, and removed)
    <ablate.out>/.lock                the process writing the folder (``posenc_lab.rundir.RunLock``): a second
                                      ``posenc-lab ablate`` into the same folder is refused while the first runs

The folder is ablate's alone. ``ablate.out`` may be a new or empty folder, or one an earlier `posenc-lab ablate`
made (it has ``.ablate.json``), which is continued. Anything else is refused before any compute (``foreign``): a
folder of other files, and an ablate folder that holds files of another's beside the ones above (it would be
written over or mixed in). A folder of an ablate from before the mark (its names above, and a runs/ of run
directories only) is recognised and marked.

The report folder is ablate's own and is rewritten whole: each report is written into ``.report.new/`` (the
per-token dumps of the last one hard-linked in: they are kept by their fingerprint, see ``dumps``) and swapped in
for ``report/`` when it is complete, so that no file of an older report stays beside a new one, and an
interrupted report leaves the last complete one in place.
"""

from __future__ import annotations

import datetime
import os
import shutil
from pathlib import Path

from ..grid import LEDGER, LOGS, Ledger, ledger_file, log_file
from ..io import CorruptFileError, path_problem, read_json, write_json
from ..rundir import LOCK_FILE, RUNS, RunDir, RunLock, run_folder

KEY = "ablate.out"
FORMAT = 1


class AblationDir:
    MARK = ".ablate.json"
    RUNS = RUNS
    LOGS = LOGS
    REPORT = "report"
    TIMES = LEDGER
    OLD_TIMES = "ablate_times.json"  # the ledger of an earlier version: the same entries, alone in the file
    NEW_REPORT = ".report.new"  # the report being written
    OLD_REPORT = ".report.old"  # the report being replaced (left only by a kill between two renames)
    DUMPS = "dumps"

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).resolve()

    def __repr__(self) -> str:
        return f"AblationDir({str(self.path)!r})"

    @property
    def mark(self) -> Path:
        return self.path / self.MARK

    @property
    def runs(self) -> Path:
        return self.path / self.RUNS

    def run(self, name: str) -> Path:
        """The run directory of the grid's run ``name`` (the grid runner's one rule)."""
        return run_folder(self.path, name)

    @property
    def logs(self) -> Path:
        return self.path / self.LOGS

    def log(self, name: str) -> Path:
        """The training log of run ``name`` (the grid runner's rule)."""
        return log_file(self.path, name)

    @property
    def report(self) -> Path:
        return self.path / self.REPORT

    @property
    def times(self) -> Path:
        return ledger_file(self.path)

    def ledger(self, log=print) -> Ledger:
        """The grid's state (grid.json); an earlier version's ablate_times.json is read into it once, written as
        grid.json and removed, said in one line (``log``). Under the folder's lock."""
        old = self.path / self.OLD_TIMES
        if self.times.exists() or not old.exists():
            return Ledger(self.times, log)
        ledger = Ledger(old, log)
        ledger.path = self.times
        ledger.write()
        old.unlink()
        log(f"{old} (an earlier version's) is now {self.times}")
        return ledger

    def problem(self) -> str | None:
        """Why the folder cannot be written (a file in its place, no permission, ...), in one line; None if it can."""
        return path_problem(self.path, KEY)

    # ---- whose folder it is ----
    def _own(self, name: str) -> bool:
        """A name `posenc-lab ablate` writes at the top of its folder (a temporary of its atomic writes too)."""
        own = {self.MARK, self.RUNS, self.LOGS, self.REPORT, self.TIMES, self.OLD_TIMES, LOCK_FILE}
        temporary = name.startswith((f".{self.TIMES}.", f".{self.OLD_TIMES}.", f".{self.MARK}.")) and ".tmp" in name
        return name in own | {self.NEW_REPORT, self.OLD_REPORT} or temporary

    def _marked(self) -> bool:
        try:
            mark = read_json(self.mark)
        except (OSError, CorruptFileError):
            return False
        return isinstance(mark, dict) and mark.get("made_by") == "posenc-lab ablate"

    def _made_before_the_mark(self, names: list[str]) -> bool:
        """A folder of an ablate from before ``.ablate.json``: only its names, and a runs/ of run directories."""
        if not self.runs.is_dir() or not all(self._own(n) for n in names):
            return False
        runs = list(self.runs.iterdir())
        return bool(runs) and all(RunDir(r).record_file.is_file() for r in runs)

    def foreign(self) -> str | None:
        """Why ``ablate.out`` is not a folder ablate may write, in one line naming it and what would do; None if it
        is new, empty, or one ablate made. Nothing is read but names and the mark: call it before any compute."""
        if not self.path.is_dir():
            return None
        names = sorted(p.name for p in self.path.iterdir())
        if not names or names == [LOCK_FILE]:  # new (a kill between the lock and the mark leaves the lock alone)
            return None
        others = [n for n in names if not self._own(n)]
        shown = ", ".join(others[:5]) + (" ..." if len(others) > 5 else "")
        if self._marked() or self._made_before_the_mark(names):
            if not others:
                return None
            return (
                f"{KEY}={self.path} was made by posenc-lab ablate but also holds files it did not write: {shown}; "
                f"move them out of the folder (it holds only {self.MARK}, {self.RUNS}/, {self.LOGS}/, {self.REPORT}/ "
                f"and {self.TIMES}) and rerun"
            )
        return (
            f"{KEY}={self.path} is a folder that posenc-lab ablate did not make (no {self.MARK}; it holds "
            f"{', '.join(names[:5])}{' ...' if len(names) > 5 else ''}); use a new or empty folder, or the "
            f"{KEY} of an earlier posenc-lab ablate to continue it"
        )

    def claim(self) -> None:
        """Mark the folder as ablate's (under its lock, before anything else is written there)."""
        if not self._marked():
            adopted = {"adopted": True} if self.runs.is_dir() else {}
            now = datetime.datetime.now().isoformat(timespec="seconds")
            write_json(self.mark, {"made_by": "posenc-lab ablate", "format": FORMAT, "created": now, **adopted})

    def lock(self) -> RunLock:
        """``with out.lock():`` -- this process alone writes the folder; a second one is refused in one line."""
        return RunLock(self.path, key=KEY)

    # ---- the report, rewritten whole ----
    def new_report(self) -> Path:
        """An empty ``.report.new/`` for the next report, with the dumps of the newest earlier one linked in."""
        new, old = self.path / self.NEW_REPORT, self.path / self.OLD_REPORT
        shutil.rmtree(old, ignore_errors=True)
        # the dumps of an interrupted report are newer than the complete one's
        source = new / self.DUMPS if (new / self.DUMPS).is_dir() else self.report / self.DUMPS
        if new.exists():
            for p in new.iterdir():
                if p.name != self.DUMPS:
                    shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        new.mkdir(exist_ok=True)
        if source.is_dir() and source.parent != new:
            shutil.copytree(source, new / self.DUMPS, copy_function=_link_or_copy)
        return new

    def publish_report(self, new: Path) -> Path:
        """Swap the complete report in ``new`` (``new_report``) in for ``report/``; the report folder."""
        old = self.path / self.OLD_REPORT
        if self.report.exists():
            os.replace(self.report, old)
        os.replace(new, self.report)
        shutil.rmtree(old, ignore_errors=True)
        return self.report


def _link_or_copy(src: str, dst: str) -> None:
    """A hard link (the dumps are written by rename, so the old report's copy never changes), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
