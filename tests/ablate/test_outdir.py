"""`posenc-lab ablate`'s output folder (posenc_lab/ablate/outdir.py): a folder it did not make (another grid's too)
is refused in one line before any compute and left as it was; its one state file, grid.json, holds the mark, and an
earlier version's files (.ablate.json, ablate_times.json) are moved into it once; a damaged grid.json is refused
with what to do; the report folder is rewritten whole; grid.json keeps the seconds of every attempt of every run,
through SIGTERM and a kill -9 of ablate itself."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest

from posenc_lab import ablate
from posenc_lab.ablate.outdir import AblationDir
from posenc_lab.grid import Ledger
from posenc_lab.io import CorruptFileError
from posenc_lab.processes import Pool, process_cpu_s
from tests.ablate.test_ablate import SMALL_GRID, ablate_process

ONE_RUN = [*SMALL_GRID, "ablate.recurrence=[true]"]  # xl_mem16_full_seed0 alone


def tree(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (hidden ones too) -> the SHA-256 of its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def users_report_folder(u: Path) -> None:
    """A folder a user wrote a report and a temporary file into, beside the names ablate would write."""
    (u / "report").mkdir(parents=True)
    (u / "logs").mkdir()
    (u / "report" / "report.md").write_text("MINE\n")
    (u / "report" / ".keep.tmp1").write_text("x\n")
    (u / "report" / "table6.csv").write_text("cell,loss\nmine,1\n")
    (u / "logs" / "xl_mem16_full_seed0.log").write_text("my log\n")
    (u / "ablate_times.json").write_text('{"mine": 1}\n')


def marked_with_extra(u: Path) -> None:
    """A folder ablate made, where a file of another's was put beside its own."""
    AblationDir(u).claim()
    (u / "notes.txt").write_text("mine\n")


def a_run(folder: Path) -> None:
    """A run directory (its record, run.json) in ``folder``."""
    folder.mkdir(parents=True)
    (folder / "run.json").write_text('{"identity": {}}')


def sweep_folder(u: Path) -> None:
    """A `posenc-lab sweep`'s folder in the middle of its sweep: the grid's names only (grid.json with the sweep's
    section, runs/ of run directories, logs/), which a folder of an ablate from before the mark also has."""
    ledger = Ledger(u / "grid.json")
    ledger.sections["sweep"] = {"sweep_id": "abcd1234", "seed": 7}
    ledger.recorded["abcd1234"] = {"id": "abcd1234", "state": "finished", "status": "trained"}
    ledger.write()
    a_run(u / "runs" / "abcd1234")
    (u / "logs").mkdir()
    (u / "logs" / "abcd1234.log").write_text("trained\n")


LAYOUTS = {
    "a user's report folder": (
        users_report_folder,
        "did not make (no grid.json with its mark; it holds ablate_times.json, logs, report)",
    ),
    "a sweep's folder": (
        sweep_folder,
        "did not make (its grid.json is another grid's, with no posenc-lab ablate mark (its sections: sweep); it "
        "holds grid.json, logs, runs)",
    ),
    "a report folder alone": (
        lambda u: (u / "report").mkdir() or (u / "report" / "report.md").write_text("MINE"),
        "report",
    ),
    "a times file alone": (lambda u: (u / "ablate_times.json").write_text("{}"), "ablate_times.json"),
    "a folder of papers": (lambda u: (u / "paper.pdf").write_bytes(b"%PDF"), "paper.pdf"),
    "an ablate folder with a file of another's": (marked_with_extra, "also holds files it did not write: notes.txt"),
}


def refused_before_any_compute(u: Path, capsys, monkeypatch) -> str:
    """`posenc-lab ablate` into ``u`` exits 2 before it plans (loads the corpus); its error output."""

    def no_plan(*a, **k):
        raise AssertionError("ablate planned (loaded the corpus) before refusing the folder")

    monkeypatch.setattr(importlib.import_module("posenc_lab.ablate.main"), "plan", no_plan)
    assert ablate.main([*ONE_RUN, "ablate.seeds=[0]", f"ablate.out={u}"]) == 2
    return capsys.readouterr().err.strip()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_folder_ablate_did_not_make_is_refused_before_any_compute_and_left_as_it_was(
    layout, tmp_path, capsys, monkeypatch
):
    make, names = LAYOUTS[layout]
    u = tmp_path / "U"
    u.mkdir()
    make(u)
    before = tree(u)

    err = refused_before_any_compute(u, capsys, monkeypatch)
    assert len(err.splitlines()) == 1 and err.startswith(f"posenc-lab ablate: error: ablate.out={u} ")
    assert names in err
    valid = "use a new or empty folder, or the ablate.out of an earlier posenc-lab ablate to continue it"
    assert valid in err or "move them out of the folder" in err
    assert tree(u) == before  # not a byte changed, nothing added (no lock, no mark, no runs/)


def test_a_new_or_empty_folder_and_one_ablate_made_are_taken(tmp_path):
    assert AblationDir(tmp_path / "new").foreign() is None
    assert AblationDir(tmp_path).foreign() is None  # empty
    (tmp_path / ".lock").write_text("")  # a kill between taking the lock and writing the mark
    assert AblationDir(tmp_path).foreign() is None
    out = AblationDir(tmp_path)
    out.claim()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "grid.json"]  # the mark is its first write
    mark = json.loads(out.times.read_text())["ablate"]
    assert mark["made_by"] == "posenc-lab ablate" and "created" in mark and "adopted" not in mark
    for name in ("runs", "logs", "report"):
        (tmp_path / name).mkdir()
    (tmp_path / "ablate_times.json").write_text("{}")  # an earlier version's, left beside grid.json by a kill
    (tmp_path / ".ablate_times.json.abc.tmp.json").write_text("{")  # a write cut by a kill
    (tmp_path / ".grid.json.def.tmp.json").write_text("{")
    (tmp_path / "..ablate.json.ghi.tmp.json").write_text("{")  # an earlier version's mark, cut by a kill
    assert out.foreign() is None


def test_a_folder_of_an_ablate_from_before_the_mark_is_recognised_and_marked(tmp_path):
    """Its names only, and a runs/ of run directories (run.json): continued, and marked as adopted, in grid.json
    with the entries of its ablate_times.json."""
    run = tmp_path / "runs" / "xl_mem16_full_seed0"
    run.mkdir(parents=True)
    (tmp_path / "logs").mkdir()
    (tmp_path / "ablate_times.json").write_text('{"xl_mem16_full_seed0": {"status": "trained", "wall_s": 5.0}}')
    out = AblationDir(tmp_path)
    assert "did not make" in out.foreign()  # a runs/ folder that holds no run is not an ablation's
    (run / "run.json").write_text('{"identity": {}}')
    assert out.foreign() is None
    said = []
    assert list(out.claim(said.append).recorded) == ["xl_mem16_full_seed0"]
    state = json.loads(out.times.read_text())
    assert state["ablate"]["adopted"] is True and state["trials"]["xl_mem16_full_seed0"]["wall_s"] == 5.0
    assert said == [f"{tmp_path / 'ablate_times.json'} (an earlier version's) is now {out.times}"]
    (tmp_path / "runs" / "mine").mkdir()  # a marked folder is not judged by its runs/ any more (train judges them)
    assert out.foreign() is None


def earlier_version(folder: Path, times: str) -> dict:
    """An ablate folder of the version that kept its mark in .ablate.json, its ledger in ``times``
    (grid.json, or ablate_times.json before it): one finished run. The mark."""
    a_run(folder / "runs" / "xl_mem16_full_seed0")
    (folder / "logs").mkdir()
    entry = {"status": "trained", "wall_s": 5.0, "cpu_s": 4.0, "attempts": 1, "updated": "2026-01-01T00:00:00"}
    data = {"format": 2, "trials": {"xl_mem16_full_seed0": entry}} if times == "grid.json" else {"r": entry}
    (folder / times).write_text(json.dumps(data))
    mark = {"made_by": "posenc-lab ablate", "format": 1, "created": "2026-01-01T00:00:00"}
    (folder / ".ablate.json").write_text(json.dumps(mark))
    return mark


@pytest.mark.parametrize("times", ["grid.json", "ablate_times.json"])
def test_an_earlier_versions_mark_is_moved_into_grid_json_once(times, tmp_path):
    """A folder of the version with .ablate.json is still ablate's: continued, its mark the section of grid.json
    (its content as it was) beside its runs' entries, .ablate.json removed, each move said in one line; the mark
    stays through the grid runner's writes and the next invocation, which says nothing."""
    mark = earlier_version(tmp_path, times)
    entries = json.loads((tmp_path / times).read_text())
    entries = entries.get("trials", entries)
    out = AblationDir(tmp_path)
    assert out.foreign() is None
    said = []
    ledger = out.claim(said.append)
    moved = f"{tmp_path / '.ablate.json'} (an earlier version's mark) is now the 'ablate' section of {out.times}"
    migrated = [f"{tmp_path / 'ablate_times.json'} (an earlier version's) is now {out.times}"]
    assert said == (migrated if times == "ablate_times.json" else []) + [moved]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.json", "logs", "runs"]
    assert json.loads(out.times.read_text()) == {"format": 2, "trials": entries, "ablate": mark}
    ledger.start("r2", tmp_path / "runs" / "r2")  # the grid runner writes the ledger: the mark stays
    ledger.end("r2", 1.0, 1.0, "trained")
    assert json.loads(out.times.read_text())["ablate"] == mark
    assert out.foreign() is None  # the next invocation: the mark is read from grid.json
    state, before = out.times.read_text(), list(said)
    assert out.claim(said.append).recorded == ledger.recorded
    assert said == before and out.times.read_text() == state  # once


def test_the_report_is_rewritten_whole_and_keeps_its_dumps(tmp_path, capsys):
    """A file in report/ that the new report does not write does not stay beside it; the per-token dumps of the
    last report are reused (the same file), not computed again."""
    out = tmp_path / "out"
    args = [*ONE_RUN, "trainer.max_steps=2", "ablate.analysis.sections=[data]", f"ablate.out={out}"]
    assert ablate.main(args) == 0
    report = out / "report"
    written = set(tree(report))
    assert "report.md" in written and not (out / ".report.new").exists()
    dump = next(report.glob("dumps/*/xl_mem16_full_seed0.npz"))
    inode = dump.stat().st_ino
    (report / "table6.csv").write_text("stale\n")  # an older report's files, or a file put there
    (report / "old" / "figure.png").parent.mkdir()
    (report / "old" / "figure.png").write_bytes(b"png")
    capsys.readouterr()
    assert ablate.main(args) == 0
    assert set(tree(report)) == written and dump.stat().st_ino == inode
    assert sorted(p.name for p in out.iterdir()) == ["grid.json", "logs", "report", "runs"]  # one state file
    assert json.loads((out / "grid.json").read_text())["ablate"]["made_by"] == "posenc-lab ablate"


def test_an_interrupted_report_leaves_the_last_one_and_its_newer_dumps_are_kept(tmp_path):
    out = AblationDir(tmp_path)
    (out.report / "dumps" / "as_trained").mkdir(parents=True)
    (out.report / "report.md").write_text("complete\n")
    (out.report / "dumps" / "as_trained" / "a.npz").write_bytes(b"old")
    new = out.new_report()
    assert (new / "dumps" / "as_trained" / "a.npz").read_bytes() == b"old"
    (new / "dumps" / "as_trained" / "b.npz").write_bytes(b"newer")  # then the report is interrupted
    (new / "table.csv").write_text("half written")
    assert (out.report / "report.md").read_text() == "complete\n"  # the last complete report stays in place
    new = out.new_report()  # the next invocation
    assert sorted(p.name for p in new.rglob("*") if p.is_file()) == ["a.npz", "b.npz"]
    (new / "report.md").write_text("new\n")
    assert out.publish_report(new) == out.report
    assert (out.report / "report.md").read_text() == "new\n" and (
        out.report / "dumps" / "as_trained" / "b.npz"
    ).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]


# ---- grid.json (the ledger on its own: tests/test_grid.py) ------------------------------------------------


def test_a_stopped_attempt_is_recorded_and_the_next_attempts_add_up(tmp_path):
    """The ledger on its own: a training process stopped by a signal leaves its wall and CPU seconds (os.wait4), an
    attempt of a later invocation adds to them and counts, a run directory made anew starts afresh."""
    path = tmp_path / "grid.json"
    run = tmp_path / "run"
    ledger = Ledger(path)
    ledger.start("r", run)
    ledger.update("r", 0.0, 0.0, "running", force=True)
    assert json.loads(path.read_text())["trials"]["r"]["status"] == "running"  # on disk from its start
    pool = Pool(1)  # the grid runner's pool: its stop passes the signal on and reaps with os.wait4
    code = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ntime.sleep(60)"
    proc = pool.start("r", [sys.executable, "-c", code], dict(os.environ), tmp_path / "r.log").proc
    pool.running["r"].start -= 1.0
    while (process_cpu_s(proc.pid) or 0) < 0.3:
        time.sleep(0.05)
    pool.stop(15, 60.0, lambda job: ledger.end(job.name, job.wall_s, job.cpu_s, "stopped"))
    first = json.loads(path.read_text())["trials"]["r"]
    assert first["status"] == "stopped" and first["attempts"] == 1 and proc.returncode == -signal.SIGTERM
    assert first["wall_s"] >= 1.0 and first["cpu_s"] >= 0.3
    later = Ledger(path)  # the next invocation continues the run (stopped before it made its directory)
    later.start("r", run)
    later.end("r", 2.0, 1.5, "resumed")
    second = json.loads(path.read_text())["trials"]["r"]
    assert second["attempts"] == 2 and second["status"] == "resumed"
    assert second["wall_s"] == pytest.approx(first["wall_s"] + 2.0) and second["cpu_s"] == pytest.approx(
        first["cpu_s"] + 1.5
    )
    run.mkdir()
    later.start("r", run)  # a third attempt: the run's directory is there, the sum goes on
    later.end("r", 1.0, 1.0, "resumed")
    assert json.loads(path.read_text())["trials"]["r"]["attempts"] == 3
    run.rmdir()  # a finished run's directory deleted by hand: a new run, a new sum
    later.start("r", run)
    later.end("r", 3.0, 2.0, "trained")
    assert {k: json.loads(path.read_text())["trials"]["r"][k] for k in ("attempts", "wall_s", "cpu_s")} == {
        "attempts": 1,
        "wall_s": 3.0,
        "cpu_s": 2.0,
    }


def test_an_earlier_versions_ablate_times_json_becomes_grid_json_once(tmp_path):
    """An ablate folder of an earlier version, its ledger in ablate_times.json: it is still the folder ablate made,
    and its entries become grid.json (format 2), with the mark, when ablate takes the folder, said in one line."""
    a_run(tmp_path / "runs" / "r")
    entries = {"r": {"status": "trained", "wall_s": 5.0, "cpu_s": 4.0, "attempts": 1, "updated": "2026-01-01"}}
    (tmp_path / "ablate_times.json").write_text(json.dumps(entries))
    out = AblationDir(tmp_path)
    assert out.foreign() is None
    said = []
    ledger = out.claim(said.append)
    assert ledger.recorded == entries and said == [
        f"{tmp_path / 'ablate_times.json'} (an earlier version's) is now {out.times}"
    ]
    assert not (tmp_path / "ablate_times.json").exists() and out.times == tmp_path / "grid.json"
    state = json.loads(out.times.read_text())
    assert state["trials"] == entries and state["format"] == 2 and state["ablate"]["adopted"] is True
    assert out.claim(said.append).recorded == entries and len(said) == 1  # once


def test_a_damaged_grid_json_is_refused_with_what_to_do_and_left_as_it_was(tmp_path, capsys, monkeypatch):
    """grid.json holds the mark: damaged, it cannot say whose folder it is, and run directories beside a grid.json
    may be a sweep's (whose state would be lost for good). Refused before any compute in one line naming the file
    and what to do, the folder left as it was; what it says works: without grid.json the folder is recognised by
    its runs, marked as adopted, its run kept."""
    u = tmp_path / "U"
    a_run(u / "runs" / "xl_mem16_full_seed0")
    (u / "logs").mkdir()
    (u / "grid.json").write_text('{"format": 2, "trials": {"xl_mem16')
    before = tree(u)

    err = refused_before_any_compute(u, capsys, monkeypatch)
    assert len(err.splitlines()) == 1 and err.startswith(f"posenc-lab ablate: error: ablate.out={u}: ")
    assert f"{u / 'grid.json'} is corrupt or truncated (JSONDecodeError" in err
    assert f"if posenc-lab ablate made the folder, delete {u / 'grid.json'} and rerun" in err
    with pytest.raises(CorruptFileError, match="grid.json is corrupt"):  # under the lock too, were it damaged since
        AblationDir(u).claim()
    assert tree(u) == before
    (u / "grid.json").unlink()
    out = AblationDir(u)
    assert out.foreign() is None
    out.claim()
    assert json.loads(out.times.read_text())["ablate"]["adopted"] is True
    assert (u / "runs" / "xl_mem16_full_seed0" / "run.json").is_file()


def test_a_damaged_grid_json_with_no_run_is_refused_and_one_an_earlier_mark_vouches_for_is_continued(tmp_path):
    """With no run to continue, a damaged grid.json's folder is refused, saying so. An earlier version's
    .ablate.json still says the folder is ablate's: it is continued, the ledger started afresh in one line (the
    runs' seconds are all it held) and the mark moved into it."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "grid.json").write_text('{"format": 2, "trials": {"xl_mem16')
    out = AblationDir(tmp_path)
    assert "it holds no run to continue: use a new or empty folder" in out.foreign()
    mark = {"made_by": "posenc-lab ablate", "format": 1, "created": "2026-01-01T00:00:00"}
    (tmp_path / ".ablate.json").write_text(json.dumps(mark))
    assert out.foreign() is None
    said = []
    assert out.claim(said.append).recorded == {}
    assert len(said) == 2 and said[0].startswith(f"{out.times} is corrupt") and "starting it afresh" in said[0]
    assert "(an earlier version's mark) is now the 'ablate' section" in said[1]
    assert json.loads(out.times.read_text()) == {"format": 2, "trials": {}, "ablate": mark}
    assert not (tmp_path / ".ablate.json").exists()


def test_a_folder_of_the_version_with_ablate_json_is_continued_by_the_same_command(tmp_path, capsys):
    """The command end to end: a trained folder turned into the earlier version's (the mark in .ablate.json, not in
    grid.json) is continued, its run reused, and the mark moved into grid.json, said in one line of its log."""
    out = tmp_path / "out"
    args = [*ONE_RUN, "trainer.max_steps=2", f"ablate.out={out}", "--train-only"]
    assert ablate.main(args) == 0
    state = json.loads((out / "grid.json").read_text())
    mark = state.pop("ablate")
    (out / "grid.json").write_text(json.dumps(state))
    (out / ".ablate.json").write_text(json.dumps(mark))
    capsys.readouterr()
    assert ablate.main(args) == 0
    said = capsys.readouterr().out
    moved = f"{out / '.ablate.json'} (an earlier version's mark) is now the 'ablate' section of {out / 'grid.json'}"
    assert re.search(rf"^\[ *[\d.]+s\] {re.escape(moved)}$", said, re.M) and "xl_mem16_full_seed0: reused" in said
    assert json.loads((out / "grid.json").read_text()) == {**state, "ablate": mark}
    assert sorted(p.name for p in out.iterdir()) == ["grid.json", "logs", "runs"]


def test_an_earlier_mark_left_beside_its_section_by_a_kill_is_removed(tmp_path):
    """A kill between grid.json's write and the removal of .ablate.json: the next invocation removes it and keeps
    the section as it is."""
    mark = earlier_version(tmp_path, "grid.json")
    out = AblationDir(tmp_path)
    out.claim(lambda msg: None)
    state = out.times.read_text()
    (tmp_path / ".ablate.json").write_text(json.dumps({**mark, "created": "another time"}))
    assert out.foreign() is None
    out.claim(lambda msg: None)
    assert not (tmp_path / ".ablate.json").exists() and out.times.read_text() == state


class SlowSteps(L.Callback):
    """Each training step takes ``seconds`` longer: a run lasts long enough to be stopped where the test wants."""

    def __init__(self, seconds: float):
        self.seconds = float(seconds)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        time.sleep(self.seconds)


def wait_for(what: str, ok, proc: subprocess.Popen, timeout: float = 300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := ok():
            return value
        assert proc.poll() is None, f"ablate exited before {what}: " + "".join(proc.communicate())
        time.sleep(0.2)
    raise AssertionError(f"no {what} in {timeout} s")


def recorded(out: Path) -> dict:
    try:
        return json.loads((out / "grid.json").read_text())["trials"]
    except (FileNotFoundError, ValueError):
        return {}


def test_ablate_times_keeps_every_run_through_sigterm_and_a_kill_9_of_ablate(tmp_path):
    """Two runs, one at a time, each step slowed down: a SIGTERM after the first finished, a kill -9 of ablate
    while the second trains, then a rerun to the end. Every run's seconds are there, the second's the sum of its
    three attempts."""
    out = tmp_path / "out"
    args = (
        *SMALL_GRID,
        f"ablate.out={out}",
        "trainer.max_steps=80",
        "checkpoint_every=5",
        "+callbacks.slow._target_=tests.ablate.test_outdir.SlowSteps",
        "+callbacks.slow.seconds=0.1",
        "--train-only",
    )
    first, second = "xl_mem16_full_seed0", "xl_mem0_full_seed0"
    proc = ablate_process(*args)
    wait_for("second run", lambda: recorded(out).get(second, {}).get("status") == "running", proc)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 128 + signal.SIGTERM, stdout + stderr
    times = recorded(out)
    assert times[first]["status"] == "trained" and times[first]["attempts"] == 1 and times[first]["cpu_s"] > 0
    assert times[second]["status"] == "stopped" and times[second]["attempts"] == 1
    stopped = times[second]["wall_s"]

    proc = ablate_process(*args)  # the second run trains on; ablate itself is killed while it does
    wait_for(
        "heartbeat", lambda: (t := recorded(out).get(second, {})).get("attempts") == 2 and t["wall_s"] > stopped, proc
    )
    os.kill(proc.pid, signal.SIGKILL)
    stdout, _ = proc.communicate(timeout=60)
    child = int(re.findall(r"\(pid (\d+)", stdout)[-1])
    deadline = time.monotonic() + 120
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:  # it saves and exits (no orphan)
        time.sleep(0.2)
    assert not Path(f"/proc/{child}").exists()
    killed = recorded(out)[second]
    assert killed["status"] == "running" and killed["wall_s"] > stopped  # as of its last heartbeat

    proc = ablate_process(*args)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stdout + stderr
    assert f"{first}: reused" in stdout
    final = recorded(out)
    assert final[first] == times[first]  # a reused run adds nothing
    assert final[second]["attempts"] == 3 and final[second]["status"] in ("resumed", "trained")
    assert final[second]["wall_s"] > killed["wall_s"] and final[second]["cpu_s"] > killed["cpu_s"]
    results = json.loads((out / "runs" / second / "results.json").read_text())
    assert results["steps"] == 80
