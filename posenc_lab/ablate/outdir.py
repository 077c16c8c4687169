"""An ablation's output folder (``ablate.out``): the one place that names its files, as ``posenc_lab.rundir.RunDir``
does for a run, and its lock.

    <ablate.out>/runs/<run>/          one `posenc-lab train` run directory each (``plan.RunSpec.name``)
    <ablate.out>/logs/<run>.log       the output of each run's training process
    <ablate.out>/report/              report.md, its CSVs and PNGs
    <ablate.out>/grid.json            the grid's one state file (``posenc_lab.grid.Ledger``): every run, its
                                      overrides, status and wall and CPU seconds, and the folder's mark, its section
                                      ``ablate`` (made_by "posenc-lab ablate", format, created, and adopted for a
                                      folder of an ablate from before the mark), written when ablate first takes it
    <ablate.out>/.lock                the process writing the folder (``posenc_lab.rundir.RunLock``): a second
                                      ``posenc-lab ablate`` into the same folder is refused while the first runs

An earlier version's files are read into grid.json once and removed, each said in one line (``claim``): its
ablate_times.json (the runs' entries alone) and its .ablate.json (the mark in a file of its own: its content is
the section).

The folder is ablate's alone. ``ablate.out`` may be a new or empty folder, or one an earlier `posenc-lab ablate`
made (its grid.json bears the mark, or an earlier version's .ablate.json), which is continued. Anything else is
refused before any compute (``foreign``): a folder of other files, another grid's (a `posenc-lab sweep`'s
grid.json, which has no ablate mark), and an ablate folder that holds files of another's beside the ones above
(they would be written over or mixed in). A folder of an ablate from before the mark (its names above but no
grid.json, and a runs/ of run directories only) is recognised and marked. A damaged grid.json is refused with
what to do, unless an earlier version's .ablate.json vouches for the folder: the mark is in it, and a folder of
run directories and a grid.json cannot be told from a sweep's by its names (the sweep's state would be lost for
good); once grid.json is deleted, the folder is recognised by its runs as one from before the mark, and only the
runs' recorded seconds are lost.

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
from typing import Any

from ..grid import LEDGER, LOGS, Ledger, ledger_file, log_file
from ..io import CorruptFileError, path_problem, read_json
from ..rundir import LOCK_FILE, RUNS, RunDir, RunLock, run_folder

KEY = "ablate.out"
FORMAT = 1  # the format of the mark itself
SECTION = "ablate"  # the mark's section of grid.json
MADE_BY = "posenc-lab ablate"


def is_mark(value: Any) -> bool:
    """``value`` is ablate's mark (grid.json's section, or the content of an earlier version's .ablate.json)."""
    return isinstance(value, dict) and value.get("made_by") == MADE_BY


class AblationDir:
    OLD_MARK = ".ablate.json"  # the mark of an earlier version: a file of its own, with the section's content
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
    def old_mark(self) -> Path:
        return self.path / self.OLD_MARK

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

    def problem(self) -> str | None:
        """Why the folder cannot be written (a file in its place, no permission, ...), in one line; None if it can."""
        return path_problem(self.path, KEY)

    # ---- whose folder it is ----
    def _own(self, name: str) -> bool:
        """A name `posenc-lab ablate` writes at the top of its folder (a temporary of its atomic writes too), or
        wrote in an earlier version."""
        own = {self.OLD_MARK, self.RUNS, self.LOGS, self.REPORT, self.TIMES, self.OLD_TIMES, LOCK_FILE}
        temporary = name.startswith((f".{self.TIMES}.", f".{self.OLD_TIMES}.", f".{self.OLD_MARK}.")) and ".tmp" in name
        return name in own | {self.NEW_REPORT, self.OLD_REPORT} or temporary

    def _old_mark(self) -> dict | None:
        """The content of an earlier version's .ablate.json if it is ablate's mark, else None."""
        try:
            mark = read_json(self.old_mark)
        except (OSError, CorruptFileError):
            return None
        return mark if is_mark(mark) else None

    def _sections(self) -> dict[str, Any]:
        """grid.json's sections ({} if there is none); CorruptFileError if it cannot be read. Nothing is written."""
        return Ledger(self.times, remedy="its sections cannot be read").sections

    def _marked(self) -> bool:
        """The folder bears ablate's mark: grid.json's section, or an earlier version's .ablate.json (which
        ``claim`` moves into grid.json). CorruptFileError if grid.json cannot be read and no .ablate.json vouches."""
        return self._old_mark() is not None or is_mark(self._sections().get(SECTION))

    def _made_before_the_mark(self, names: list[str]) -> bool:
        """A folder of an ablate from before the mark: only its names and no grid.json (every version that wrote
        grid.json marked the folder first), and a runs/ of run directories."""
        if self.TIMES in names or not self.runs.is_dir() or not all(self._own(n) for n in names):
            return False
        runs = list(self.runs.iterdir())
        return bool(runs) and all(RunDir(r).record_file.is_file() for r in runs)

    def foreign(self) -> str | None:
        """Why ``ablate.out`` is not a folder ablate may write, in one line naming it and what would do; None if it
        is new, empty, or one ablate made. Nothing is read but names, the mark and grid.json's sections, and
        nothing is written: call it before any compute."""
        if not self.path.is_dir():
            return None
        names = sorted(p.name for p in self.path.iterdir())
        if not names or names == [LOCK_FILE]:  # new (a kill between the lock and the mark leaves the lock alone)
            return None
        others = [n for n in names if not self._own(n)]
        shown = ", ".join(others[:5]) + (" ..." if len(others) > 5 else "")
        try:
            marked = self._marked()
        except CorruptFileError as e:
            return self._damaged(e, names)
        if marked or self._made_before_the_mark(names):
            if not others:
                return None
            return (
                f"{KEY}={self.path} was made by posenc-lab ablate but also holds files it did not write: {shown}; "
                f"move them out of the folder (it holds only {self.RUNS}/, {self.LOGS}/, {self.REPORT}/ and "
                f"{self.TIMES}) and rerun"
            )
        if self.TIMES in names:
            sections = ", ".join(sorted(self._sections())) or "none"
            why = f"its {self.TIMES} is another grid's, with no posenc-lab ablate mark (its sections: {sections})"
        else:
            why = f"no {self.TIMES} with its mark"
        return (
            f"{KEY}={self.path} is a folder that posenc-lab ablate did not make ({why}; it holds "
            f"{', '.join(names[:5])}{' ...' if len(names) > 5 else ''}); use a new or empty folder, or the "
            f"{KEY} of an earlier posenc-lab ablate to continue it"
        )

    def _damaged(self, error: CorruptFileError, names: list[str]) -> str:
        """A damaged grid.json, which holds the mark: whose folder it is cannot be read, and a guess could write
        ablate's runs and state over another grid's; what to do, in one line."""
        damage = error.args[0].split(";")[0]
        if self._made_before_the_mark([n for n in names if n != self.TIMES]):
            remedy = (
                f"if posenc-lab ablate made the folder, delete {self.times} and rerun (the runs' recorded seconds "
                f"are lost with it; its finished runs are recognised and reused), else use a new or empty folder"
            )
        else:
            remedy = "it holds no run to continue: use a new or empty folder"
        return f"{KEY}={self.path}: {damage}, and it holds the mark that says who made the folder; {remedy}"

    def claim(self, log=print) -> Ledger:
        """Take the folder as ablate's and open its state (the ledger the grid runner writes): under its lock,
        once ``foreign`` took it, before anything else is written there. The mark is grid.json's section, in the
        folder's first write (a new folder's; one from before the mark is "adopted"). An earlier version's
        ablate_times.json (its runs' entries) and .ablate.json (its mark, as the section) are read into grid.json
        in that one write, then removed, each said in one line (``log``)."""
        old_times = self.path / self.OLD_TIMES
        from_old_times = not self.times.exists() and old_times.exists()
        moved = self._old_mark()
        # a damaged grid.json starts afresh only where .ablate.json still says the folder is ablate's (``foreign``);
        # a damaged ablate_times.json holds no mark, and starts afresh
        remedy = None if moved or from_old_times else f"delete it if posenc-lab ablate made {self.path}, and rerun"
        ledger = Ledger(old_times if from_old_times else self.times, log, remedy)
        ledger.path = self.times
        marked = is_mark(ledger.sections.get(SECTION))
        if not marked:
            ledger.sections[SECTION] = moved or self._new_mark()
        if from_old_times or not marked:
            ledger.write()
        if from_old_times:
            old_times.unlink()
            log(f"{old_times} (an earlier version's) is now {self.times}")
        if self.old_mark.exists():  # moved above, or by an earlier claim cut short before this removal
            self.old_mark.unlink()
            if moved:
                log(f"{self.old_mark} (an earlier version's mark) is now the {SECTION!r} section of {self.times}")
        return ledger

    def _new_mark(self) -> dict[str, Any]:
        now = datetime.datetime.now().isoformat(timespec="seconds")
        adopted = {"adopted": True} if self.runs.is_dir() else {}
        return {"made_by": MADE_BY, "format": FORMAT, "created": now, **adopted}

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
