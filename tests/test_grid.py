"""The one grid runner (posenc_lab/grid.py, posenc_lab/processes.py): trials in a pool of processes, the signals
passed on, a failure stopping the rest, the run-folder rule, the ledger; and that the analysis launches nothing."""

from __future__ import annotations

import ast
import datetime
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra.core.utils import setup_globals
from omegaconf import OmegaConf

import posenc_lab
from posenc_lab.ablate.outdir import AblationDir
from posenc_lab.ablate.plan import RunSpec
from posenc_lab.compose import Composer
from posenc_lab.grid import Grid, Launch, Ledger, Trial, ledger_file, train_argv
from posenc_lab.io import CorruptFileError
from posenc_lab.processes import Pool
from posenc_lab.rundir import run_folder, run_name
from tests.helpers_train import subprocess_env, tiny
from tests.schemes import ROPE, XL

ANALYSIS = Path(__file__).resolve().parents[1] / "analysis"

# a child that writes the signal it gets into its file and exits 0 (as a run that saved its step), else sleeps
TRAPPING = """
import signal, sys, time
def got(signum, frame):
    open(sys.argv[1], "w").write(str(signum)); sys.exit(0)
for s in (signal.SIGINT, signal.SIGTERM):
    signal.signal(s, got)
open(sys.argv[1] + ".ready", "w").close()
time.sleep(120)
"""


def launch(name: str, code: str, tmp_path: Path, *args: str) -> Launch:
    return Launch(name, [sys.executable, "-c", code, *args], dict(os.environ), tmp_path / "logs" / f"{name}.log")


def test_every_trial_runs_with_at_most_jobs_at_once_and_its_seconds(tmp_path):
    todo = [launch(f"t{i}", f"print('trial {i}')", tmp_path) for i in range(5)]
    at_once, ended, slots = [], [], set()
    runner = Grid(2)

    def started(job):
        at_once.append(len(runner.running))
        slots.add(job.slot)

    signum = runner.run(lambda: todo.pop(0) if todo else None, ended.append, on_start=started, poll=0.05)
    assert signum is None and sorted(j.name for j in ended) == [f"t{i}" for i in range(5)]
    assert max(at_once) == 2 and slots == {0, 1}  # two job slots, each reused
    assert all(j.returncode == 0 and j.wall_s > 0 and j.cpu_s is not None and j.cpu_s > 0 for j in ended)
    assert (tmp_path / "logs" / "t3.log").read_text() == "trial 3\n"  # each trial's output in its own log


def test_a_failed_trial_stops_the_others_and_its_error_goes_on(tmp_path):
    """The ledger, written by the runner: the failed attempt as "failed", the one it stopped as "stopped"."""
    mark = tmp_path / "s"
    fail_when_ready = f"import os, sys, time\nwhile not os.path.exists({str(mark) + '.ready'!r}): time.sleep(0.05)\n"
    todo = [launch("bad", fail_when_ready + "sys.exit(3)", tmp_path), launch("slow", TRAPPING, tmp_path, str(mark))]
    stopped = []

    def ended(job):
        if job.returncode:
            raise RuntimeError(f"{job.name} exited with {job.returncode}")

    runner = Grid(2, Ledger(tmp_path / "times.json"))
    with pytest.raises(RuntimeError, match="bad exited with 3"):
        runner.run(lambda: todo.pop(0) if todo else None, ended, on_stopped=stopped.append, poll=0.05)
    assert [j.name for j in stopped] == ["slow"] and stopped[0].returncode == 0
    assert mark.read_text() == str(int(signal.SIGTERM))  # a failure's stop is SIGTERM
    ledger = json.loads((tmp_path / "times.json").read_text())["trials"]
    assert {k: v["status"] for k, v in ledger.items()} == {"bad": "failed", "slow": "stopped"}
    assert all(v["attempts"] == 1 and v["wall_s"] > 0 for v in ledger.values())


def test_the_runner_keeps_the_ledger_of_each_attempt(tmp_path):
    """An attempt's entry is on disk while it runs ("running") and holds what it did when it ends well."""
    path = tmp_path / "times.json"
    seen = []
    code = f"import json, time\ntime.sleep(0.3)\nseen = json.load(open({str(path)!r}))['trials']\n"
    code += "print(seen['r']['status'])"
    todo = [
        Launch(
            "r", [sys.executable, "-c", code], dict(os.environ), tmp_path / "r.log", run_dir=tmp_path, what="resumed"
        )
    ]
    Grid(1, Ledger(path)).run(lambda: todo.pop(0) if todo else None, seen.append, poll=0.05)
    assert (tmp_path / "r.log").read_text() == "running\n" and seen[0].returncode == 0
    entry = json.loads(path.read_text())["trials"]["r"]
    assert entry["status"] == "resumed" and entry["attempts"] == 1 and entry["cpu_s"] > 0


@pytest.mark.parametrize("pass_on, expected", [(None, signal.SIGINT), (signal.SIGTERM, signal.SIGTERM)])
def test_a_signal_ends_the_grid_and_is_passed_on_to_every_trial(tmp_path, pass_on, expected):
    """ablate passes the signal itself on (a Ctrl-C is a SIGINT to each run), sweep a SIGTERM; no trial starts
    after it; the handlers before the grid are back after it."""
    marks = [tmp_path / "a", tmp_path / "b"]
    todo = [launch(m.name, TRAPPING, tmp_path, str(m)) for m in marks] + [launch("never", "pass", tmp_path)]

    def next_launch():  # two run now; "never" waits for a slot, which the stop frees
        return todo.pop(0) if todo else None

    def tick():
        if all(Path(f"{m}.ready").exists() for m in marks):
            os.kill(os.getpid(), signal.SIGINT)

    before = signal.getsignal(signal.SIGINT)
    stopped, noted = [], []
    signum = Grid(2).run(next_launch, stopped.append, on_tick=tick, on_signal=noted.append, pass_on=pass_on, poll=0.05)
    assert signum == signal.SIGINT and noted == [signal.SIGINT] and signal.getsignal(signal.SIGINT) is before
    assert sorted(j.name for j in stopped) == ["a", "b"] and all(j.returncode == 0 for j in stopped)
    assert [m.read_text() for m in marks] == [str(int(expected))] * 2
    assert not (tmp_path / "logs" / "never.log").exists()


def test_a_second_signal_kills_at_once(tmp_path):
    """A trial that ignores the stop would get the whole grace period; a second signal cuts it short."""
    ignoring = "import signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    ignoring += "open(sys.argv[1], 'w').close()\ntime.sleep(120)"
    ready = tmp_path / "ready"
    todo = [launch("stubborn", ignoring, tmp_path, str(ready))]
    sent = []

    def tick():
        if ready.exists() and not sent:
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGTERM)

    def stop_now():  # the second signal, while the runner waits for the trial to stop
        os.kill(os.getpid(), signal.SIGTERM)

    stopped = []
    signum = Grid(1).run(
        lambda: todo.pop(0) if todo else None,
        stopped.append,
        on_tick=tick,
        on_stop=stop_now,
        grace=100,
        poll=0.05,
    )
    assert signum == signal.SIGTERM and stopped[0].returncode == -signal.SIGKILL
    assert time.monotonic() - sent[0] < 30  # not the grace of 100 s


def test_the_pool_refuses_more_than_its_jobs(tmp_path):
    pool = Pool(1)
    pool.start("a", [sys.executable, "-c", "import time; time.sleep(30)"], dict(os.environ), tmp_path / "a.log")
    with pytest.raises(RuntimeError, match="1 of 1 jobs run"):
        pool.start("b", [sys.executable, "-c", "pass"], dict(os.environ), tmp_path / "b.log")
    pool.stop(signal.SIGTERM, 10.0)
    assert not pool.running


def test_one_run_folder_rule_for_ablate_and_sweep(tmp_path):
    assert run_folder(tmp_path, "xl_mem32_full_seed0") == tmp_path.resolve() / "runs" / "xl_mem32_full_seed0"
    assert AblationDir(tmp_path).run("r") == run_folder(tmp_path, "r")
    trial = RunSpec("r", None, "xl", 32, 1.0, ["experiment=quick", "seed=1"], 1).trial
    assert trial == Trial("r", ("experiment=quick", "seed=1"))
    argv = train_argv(trial, run_folder(tmp_path, "r"))
    assert argv[:3] == [sys.executable, "-m", "posenc_lab.train"] and argv[-1].startswith("run_dir=")
    assert str(tmp_path.resolve() / "runs" / "r") in argv[-1]
    source = (Path(posenc_lab.__file__).parent / "sweeps" / "run.py").read_text()
    assert "run_folder(out, tid)" in source and '"trials"' not in source  # sweep's default: the same rule


def test_the_analysis_launches_nothing_and_only_the_top_layer_imports_it():
    """analysis/ reads run folders: no module of it starts a process of its own (the report's worker pool computes
    dumps in this process's children; it trains nothing); of posenc_lab, only the top layer (the grids' commands
    and the command line: tests/test_imports.py's ``TOP``) imports the analysis, its core never does, and within it
    only ablate's command (the report), the sweep's table (the estimator) and the command line (compare): ablate's
    plan and its runs know nothing of the analysis."""
    from tests.test_imports import TOP

    for path in ANALYSIS.rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
        modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert "subprocess" not in names and "posenc_lab.processes" not in modules, path
        assert not {"spawn", "Popen", "Pool"} & names or path.name == "report.py", path
    root = Path(posenc_lab.__file__).parent
    importers = set()
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        if any(m.startswith(("posenc_lab_analysis", "analysis")) for m in imported):
            importers.add(".".join(("posenc_lab", *path.relative_to(root).with_suffix("").parts)))
    assert importers and all(m.startswith(TOP) for m in importers), importers
    assert importers == {"posenc_lab.ablate.main", "posenc_lab.sweeps.table", "posenc_lab.cli"}, importers


# ---- the ledger (grid.json) ---------------------------------------------------------------------------------


def test_an_entry_of_before_the_attempt_count_counts_as_one_attempt(tmp_path):
    path = tmp_path / "ablate_times.json"
    path.write_text('{"r": {"status": "trained", "wall_s": 5.0, "cpu_s": 4.0}}')
    ledger = Ledger(path)
    ledger.start("r", tmp_path)  # the run's directory is there: the run is extended
    ledger.end("r", 1.0, 1.0, "resumed")
    assert {k: json.loads(path.read_text())["trials"]["r"][k] for k in ("attempts", "wall_s", "cpu_s")} == {
        "attempts": 2,
        "wall_s": 6.0,
        "cpu_s": 5.0,
    }


def test_a_damaged_ledger_starts_afresh_in_one_line(tmp_path):
    path = tmp_path / "grid.json"
    path.write_text('{"r": {"status": "trai')
    said = []
    assert Ledger(path, said.append).recorded == {} and len(said) == 1 and "starting it afresh" in said[0]
    assert "\n" not in said[0] and str(path) in said[0]


def test_the_ledger_is_the_grid_state_and_keeps_what_its_caller_adds(tmp_path):
    """One state file: each trial's overrides, run folder and seconds, beside the keys the command that runs the
    grid keeps in the entry (a sweep's objective value) and its sections (the sweep's id); read back whole."""
    path = ledger_file(tmp_path)
    assert path == tmp_path.resolve() / "grid.json"
    ledger = Ledger(path)
    ledger.sections["sweep"] = {"sweep_id": "abcd1234", "seed": 7}
    ledger.recorded["t"] = {"id": "t", "metric": None}  # a sweep's trial before its first attempt
    ledger.start("t", run_folder(tmp_path, "t"), ["posenc=xl", "seed=1"])
    ledger.update("t", 0.0, 0.0, "running", force=True)
    ledger.recorded["t"]["metric"] = 1.5
    ledger.end("t", 2.0, 1.0, "trained")
    data = json.loads(path.read_text())
    assert data["format"] == 2 and data["sweep"] == {"sweep_id": "abcd1234", "seed": 7}
    entry = data["trials"]["t"]
    assert entry["id"] == "t" and entry["metric"] == 1.5 and entry["overrides"] == ["posenc=xl", "seed=1"]
    assert entry["run_dir"] == str(tmp_path.resolve() / "runs" / "t")
    assert (entry["status"], entry["attempts"], entry["wall_s"], entry["cpu_s"]) == ("trained", 1, 2.0, 1.0)
    again = Ledger(path)
    assert again.sections == {"sweep": data["sweep"]} and again.recorded == data["trials"]


def test_a_damaged_state_is_refused_where_it_cannot_be_started_afresh(tmp_path):
    path = ledger_file(tmp_path)
    path.write_text('{"format": 2, "trials": {"t')
    with pytest.raises(CorruptFileError, match=r"grid\.json is corrupt.*use another --out"):
        Ledger(path, remedy="use another --out")
    assert path.read_text() == '{"format": 2, "trials": {"t'  # left as it was


# ---- the one run-folder rule: train, train -m, eval (ablate and sweep: tests/ablate, tests/sweeps) --


def test_train_yaml_writes_the_run_folder_rule(tmp_path, monkeypatch):
    """conf/train.yaml's hydra.run.dir (posenc-lab train with no run_dir) and hydra.sweep.dir/subdir (train -m) are
    ``run_folder(".", run_name(...))`` for the same scheme, corpus, time and job; run_dir= names the folder."""
    when = datetime.datetime(2026, 1, 2, 3, 4, 5)
    monkeypatch.chdir(tmp_path)
    keys = ("hydra.run.dir", "hydra.sweep.dir", "hydra.sweep.subdir")
    with Composer() as composer:
        OmegaConf.register_new_resolver("now", lambda pattern: when.strftime(pattern), replace=True)
        try:  # Hydra's ${now:} (registered as the composer starts) at a known time
            cfg = composer.compose([f"posenc={ROPE}", "data=recall", "hydra.job.num=3"], return_hydra_config=True)
            run, sweep, job = (OmegaConf.select(cfg, k) for k in keys)
            named = composer.compose(["run_dir=mine"], return_hydra_config=True)
        finally:
            setup_globals()  # Hydra's own resolvers back
    assert run_name(ROPE, "recall", when) == f"2026-01-02/03-04-05_{ROPE}_recall"
    assert (
        Path(run).resolve()
        == run_folder(".", run_name(ROPE, "recall", when))
        == tmp_path / "runs" / run_name(ROPE, "recall", when)
    )
    assert (Path(sweep) / job).resolve() == run_folder(".", run_name(ROPE, "recall", when, job=3))
    assert OmegaConf.select(named, "hydra.run.dir") == "mine" and OmegaConf.select(named, "hydra.sweep.dir") == "mine"


def _seconds(before: datetime.datetime, after: datetime.datetime) -> list[datetime.datetime]:
    start = before.replace(microsecond=0)
    return [start + datetime.timedelta(seconds=i) for i in range(int((after - start).total_seconds()) + 1)]


def _train_in(folder: Path, cache: Path, *args: str) -> tuple[list[datetime.datetime], list[Path]]:
    """`python -m posenc_lab.train` in ``folder`` with no run_dir: the seconds it ran in, the run folders it made."""
    overrides = [o for o in tiny(folder / "unused", cache, steps=2) if not o.startswith("run_dir=")]
    before = datetime.datetime.now()
    proc = subprocess.run(
        [sys.executable, "-m", "posenc_lab.train", *args, *overrides],
        cwd=folder, env=subprocess_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _seconds(before, datetime.datetime.now()), [p.parent for p in folder.rglob("results.json")]


def test_train_with_no_run_dir_runs_where_the_rule_says(tmp_path, cache):
    times, made = _train_in(tmp_path, cache)
    assert len(made) == 1 and made[0] in {run_folder(tmp_path, run_name(XL, "recall", t)) for t in times}, made


@pytest.mark.slow  # about 21 s on 2 busy cores; test_train_yaml_writes_the_run_folder_rule holds the rule by default
def test_each_job_of_train_m_runs_where_the_rule_says(tmp_path, cache):
    times, made = _train_in(tmp_path, cache, "-m", "seed=0")
    assert len(made) == 1 and made[0] in {run_folder(tmp_path, run_name(XL, "recall", t, job=0)) for t in times}


def test_an_evaluation_goes_to_its_run_folder_or_the_runs_mirror_by_the_rule(tmp_path):
    from posenc_lab.evaluate import output_dir

    ckpt = tmp_path / "a run" / "checkpoints" / "good.ckpt"
    assert output_dir(ckpt, None) == tmp_path / "a run" / "eval" / "good"
    tag = hashlib.sha1(str(tmp_path / "a run").encode()).hexdigest()[:8]
    mirror = run_folder(tmp_path / "elsewhere", f"a run-{tag}")
    assert output_dir(ckpt, tmp_path / "elsewhere") == mirror / "eval" / "good"
    assert mirror == tmp_path / "elsewhere" / "runs" / f"a run-{tag}"


def test_subprocess_is_used_only_through_the_pool():
    """posenc_lab starts processes in one place, processes.spawn (sweep's scancel and train's requeue run a
    command and wait for it)."""
    package = Path(posenc_lab.__file__).parent
    users = sorted(str(p.relative_to(package)) for p in package.rglob("*.py") if "subprocess.Popen(" in p.read_text())
    assert users == ["processes.py"]
