"""Run a wandb sweep with wandb's own sweep engine and no server: ``posenc-lab sweep SWEEP.yaml``.

    posenc-lab sweep sweeps/ablation_recall.yaml --out runs/abl model=tiny trainer.max_steps=200
    posenc-lab sweep sweeps/bayes_xl.yaml --count 30 --jobs 4 --out runs/bayes
    posenc-lab sweep sweeps/bayes_xl.yaml --count 30 --jobs 8 --out runs/bayes hydra/launcher=slurm ...

The loop: the engine (engine.py) proposes the next trial from the trials so far and their metrics; the trial
runs as the sweep file's command (command.py) in a process of its own, ``--jobs`` at a time (the one grid runner,
``posenc_lab.grid``; a trial's run folder is ``rundir.run_folder`` unless the sweep file names one), in the
environment wandb's agent gives (WANDB_SWEEP_ID, WANDB_RUN_ID; wandb offline); its SweepTrial callback
(trial.py) writes the metric at every validation, which feeds hyperband (``early_terminate``) while it runs;
a trial the engine stops ends at its next validation. When a trial ends its metric is read back from its run
directory (results.json, else its last validation) and the state (state.py: the grid's one state file,
``<out>/grid.json``, which the grid runner also writes as each trial starts, runs and ends) is saved;
at the end the table (table.py) is written. Ctrl-C or SIGTERM stop the running trials cleanly (SIGTERM to
each, SIGKILL after ``--kill-after`` s), save the state and name the command that continues the sweep; before
the first trial (the checks) they end the command at once, in one line (exit 130 / 143).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from .. import grid
from ..compose import Composer
from ..errors import RunDirError, bounded, signal_name, stop_at_once
from ..io import CorruptFileError
from ..rundir import RunDir, run_folder
from ..runlock import RunLock
from . import command, engine
from .check import check_sweep, validate_config, validate_launcher
from .spec import Sweep, SweepError, load_sweep, override_key
from .state import DONE, SweepState, now
from .table import write_table
from .trial import read_history

HISTORY_FILE = "sweep_history.jsonl"
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


class Runner:
    """One invocation of a sweep: the trials the engine proposes, handed to the one grid runner (``posenc_lab.grid``)
    until ``count`` or the grid is done; each read back when it ends."""

    def __init__(self, sweep: Sweep, state: SweepState, extra: list[str], count: int | None, jobs: int, **opts: Any):
        self.sweep, self.state, self.extra, self.count, self.jobs = sweep, state, extra, count, jobs
        self.poll, self.kill_after = opts.get("poll", 0.5), opts.get("kill_after", 30.0)
        self.again = opts.get("again", "")  # the command that continues this sweep
        self.devices = opts.get("devices")  # CUDA_VISIBLE_DEVICES of each job slot, round robin
        self.metric = sweep.metric["name"]
        self.launcher = command.launcher(extra)
        self.grid = grid.Grid(jobs, state.ledger)  # the grid writes each attempt into the sweep's one state file
        self.exhausted = False
        self.signal: int | None = None
        self.stopping = False
        # the sweep's size, for the progress lines (random and bayes need a count: check_inputs)
        grid_size = math.prod(len(v) for v in sweep.parameters.values()) if sweep.method == "grid" else None
        self.total = min(x for x in (count, grid_size) if x is not None)

    # ---- the loop ---------------------------------------------------------------------------------------

    def run(self) -> int:
        for t in self.state.trials:  # left running by a runner that was killed: they continue
            if t["state"] == "running":
                t["state"] = "interrupted"
        self.state.save()
        try:
            self.signal = self.grid.run(
                self._next, self._ended, on_tick=self._early_terminate, on_signal=self._on_signal,
                on_stop=self._shutdown, pass_on=signal.SIGTERM, grace=self.kill_after, poll=self.poll,
                signals=tuple(EXIT_CODES),
            )  # fmt: skip
        finally:
            self.state.save()
            write_table(self.state, figure=True)
        return self._report()

    def _on_signal(self, signum: int) -> None:
        self.signal = signum  # no new trial starts
        print(f"\nposenc-lab sweep: {signal.Signals(signum).name}: stopping the running trials ...", flush=True)

    def _next(self) -> grid.Launch | None:
        """The next trial to start: an interrupted one first (it resumes), then the engine's proposal."""
        if self.signal is not None:
            return None
        waiting = [t for t in self.state.trials if t["state"] == "interrupted" and t["id"] not in self.grid.running]
        if waiting:
            return self._launch(waiting[0])
        if self.exhausted or (self.count is not None and len(self.state.trials) >= self.count):
            return None
        proposal = engine.propose(self.sweep.spec, self.state.trials, self.state.seed)
        if proposal is None:
            self.exhausted = True
            return None
        return self._launch(self.state.add_trial(*proposal))

    # ---- one trial --------------------------------------------------------------------------------------

    def _launch(self, trial: dict[str, Any]) -> grid.Launch:
        out, tid = self.state.out, trial["id"]
        overrides = command.trial_overrides(self.sweep, trial["params"], self.extra)
        env = command.trial_env(self.sweep.spec, self.state.sweep_id, tid)
        if self.devices:
            env["CUDA_VISIBLE_DEVICES"] = self.devices[self.grid.free_slot() % len(self.devices)]
        if trial["run_dir"] is None:
            fixed = resolve_run_dir(overrides, env, out)
            trial["run_dir"] = str(fixed or run_folder(out, tid))
        run_dir = Path(trial["run_dir"])
        trial["log"] = str(grid.log_file(out, tid))
        # an interrupted trial continues from its checkpoint (train.py's resume=auto)
        what = "resumed" if trial["state"] == "interrupted" and RunDir(run_dir).newest_checkpoint() else "trained"
        stop = self._stop_file(tid)
        stop.unlink(missing_ok=True)
        label = str(self.sweep.spec.get("name") or self.sweep.path.stem)
        runner = command.runner_overrides(run_dir, self.metric, run_dir / HISTORY_FILE, stop, label)
        args = command.merge_overrides(overrides, runner)
        if self.launcher:
            args = ["-m", *args, *command.launcher_overrides(run_dir, out / "launch" / tid)]
        argv = command.command_prefix(self.sweep.spec["command"]) + args
        trial.update(state="running", started=now(), ended=None, returncode=None, error=None)
        self.state.save()
        params = " ".join(f"{k}={v}" for k, v in trial["params"].items())
        print(f"trial {trial['number'] + 1}/{self.total} {tid}: {params} -> {run_dir}", flush=True)
        # the log's header: the trial's own environment and command line, to rerun it by hand
        log = Path(trial["log"])
        return grid.Launch(tid, argv, env, log, header=True, run_dir=run_dir, what=what, overrides=overrides)

    def _stop_file(self, trial_id: str) -> Path:
        return self.state.out / "stop" / trial_id

    def _ended(self, job: grid.Job) -> None:
        tid, returncode = job.name, job.returncode
        trial = self.state.trial(tid)
        run = RunDir(trial["run_dir"])
        trial["history"], trial["stopped_at"] = read_history(run.path / HISTORY_FILE)
        trial.update(returncode=returncode, ended=now())
        try:
            results = run.results() if returncode == 0 and run.results_file.is_file() else None
        except CorruptFileError as e:  # the trial failed after all; the sweep goes on
            results, trial["error"] = None, str(e)
        if results is not None:
            trial["steps"] = results.get("steps")
            trial["metric"] = final_metric(results, self.metric)
            if trial["metric"] is None and trial["history"]:
                trial["metric"] = trial["history"][-1][1]
            trial["state"] = "stopped" if trial["stopped_at"] is not None else "finished"
        elif self.stopping:
            trial["state"] = "interrupted"
        else:
            trial["state"] = trial["status"] = "failed"  # the grid's status too, for an exit 0 without results
            trial["error"] = trial["error"] or last_error(Path(trial["log"])) or f"exit status {returncode}"
        self._stop_file(tid).unlink(missing_ok=True)
        self.state.save()
        write_table(self.state, figure=False)
        shown = f"{self.metric}={trial['metric']:.4g}" if trial["metric"] is not None else trial["error"] or ""
        print(f"trial {tid}: {trial['state']} {shown}", flush=True)

    def _early_terminate(self) -> None:
        if not self.sweep.spec.get("early_terminate") or not self.grid.running:
            return
        for tid in self.grid.running:
            trial = self.state.trial(tid)
            trial["history"], _ = read_history(Path(trial["run_dir"]) / HISTORY_FILE)
        for tid in engine.to_stop(self.sweep.spec, self.state.trials):
            stop = self._stop_file(tid)
            if tid in self.grid.running and not stop.exists():
                stop.parent.mkdir(parents=True, exist_ok=True)
                stop.write_text(f"stopped by {self.sweep.spec['early_terminate'].get('type')} at {now()}\n")
                steps = len(self.state.trial(tid)["history"])
                print(f"trial {tid}: early termination after {steps} validation(s); it stops at the next", flush=True)

    # ---- stopping -----------------------------------------------------------------------------------------

    def _shutdown(self) -> None:
        """Before the runner's SIGTERM to every trial (Lightning stops after the current step; SweepTrial saves
        last.ckpt) and its SIGKILL after kill_after seconds: the trials that end now are interrupted, and a SLURM
        job is cancelled (scancel)."""
        self.stopping = True
        if self.launcher:
            for tid in self.grid.running:
                self._cancel_jobs(tid)

    def _cancel_jobs(self, tid: str) -> None:
        """scancel the SLURM jobs of a trial (submitit names a folder per job id under the launch dir)."""
        jobs = [p.name for p in (self.state.out / "launch" / tid / ".submitit").glob("*") if p.is_dir()]
        if jobs and shutil.which("scancel"):
            subprocess.run(["scancel", *jobs], capture_output=True)

    def _report(self) -> int:
        counts = {s: self.state.count(s) for s in (*DONE, "interrupted")}
        kept = ", ".join(f"{n} {s}" for s, n in counts.items() if n and s != "interrupted") or "no trials"
        where = f"{self.state.out / 'sweep.csv'}, {self.state.out / 'sweep.md'}"
        if self.signal is not None:
            n = counts["interrupted"]
            resumed = f"; {n} interrupted trial(s) resume from their checkpoints" if n else ""
            name = signal.Signals(self.signal).name
            print(
                f"posenc-lab sweep: stopped ({name}); kept {kept}{resumed} ({self.state.path}); "
                f"continue with: {self.again}",
                flush=True,
            )
            return EXIT_CODES[self.signal]
        print(f"posenc-lab sweep {self.state.sweep_id}: {kept}; table: {where}", flush=True)
        return 0


# ---- reading a trial back ---------------------------------------------------------------------------------


def final_metric(results: dict[str, Any], name: str) -> float | None:
    """The metric from results.json: ``val/bpb`` -> results["val"]["bpb"], ``val/acc_d1-7`` ->
    results["val"]["acc_by_distance"]["1-7"]; None for one it does not hold (``train/...``)."""
    split, _, key = name.partition("/")
    node = results.get(split) or {}
    if key.startswith("acc_d"):
        node, key = node.get("acc_by_distance") or {}, key[len("acc_d") :]
    value = node.get(key)
    return float(value) if isinstance(value, (int, float)) else None


def last_error(log: Path) -> str | None:
    """The line that says why a trial failed: posenc-lab's one-line error, else the last line of a traceback."""
    try:
        lines = [line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines()]
    except FileNotFoundError:
        return None
    lines = [line for line in lines if line and not line.startswith("(set HYDRA_FULL_ERROR")]
    ours = [line for line in lines if line.startswith("posenc-lab train: error:")]
    return (ours or lines or [None])[-1]


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def resolve_run_dir(overrides: list[str], env: dict[str, str], out: Path) -> Path | None:
    """The run directory the trial's own overrides name (``run_dir=``, or the sweep file's ``hydra.run.dir``,
    resolved in the trial's environment; a relative one under the sweep's folder ``out``, so that --out holds the
    whole sweep); None if they name none."""
    if not any(override_key(o) in command.RUN_DIR_KEYS for o in overrides):
        return None
    wandb_env = {k: env[k] for k in ("WANDB_SWEEP_ID", "WANDB_RUN_ID")}
    with Composer() as composer, _environ(wandb_env):
        cfg = composer.compose(overrides, return_hydra_config=True)
        path = OmegaConf.select(cfg, "run_dir", default=None, throw_on_missing=False)
        path = path if path is not None else OmegaConf.select(cfg, "hydra.run.dir")
    return (Path(out) / str(path)).resolve()  # an absolute path stays itself


# ---- the command line ---------------------------------------------------------------------------------------


def check_inputs(sweep: Sweep, extra: list[str], count: int | None, out: Path) -> None:
    """SweepError for anything that would fail later: the engine's schema, the count, the extra overrides (every
    trial of the file composes and validates with them), a run directory that every trial would share."""
    try:
        engine.validate(sweep.spec)
    except engine.EngineError as e:
        raise SweepError(f"{sweep.path}: {e}") from None
    if sweep.method != "grid" and count is None:
        raise SweepError(f"{sweep.path}: method {sweep.method} proposes trials without end; give --count N")
    command.check_extra(sweep, extra)
    with Composer() as composer:
        for trial in sweep.combinations():
            overrides = command.merge_overrides(trial, extra)
            try:
                cfg = composer.compose_trial(overrides, command.merge_overrides(sweep.fixed, extra))
            except Exception as e:  # noqa: BLE001 - Hydra's and OmegaConf's errors
                text = " ".join(str(e).split()).split(" Config search path")[0]
                raise SweepError(f"the overrides {' '.join(extra)} do not compose with {sweep.path}: {text}") from None
            problems = validate_launcher(cfg) + validate_config(cfg, sweep.metric, require_wandb=False)
            if problems:
                raise SweepError(f"with the overrides {' '.join(extra) or '(none)'}: {problems[0]}")
    first = command.trial_overrides(sweep, {}, extra)
    envs = [{"WANDB_SWEEP_ID": "s", "WANDB_RUN_ID": rid} for rid in ("trial1", "trial2")]
    dirs = [resolve_run_dir(first, env, out) for env in envs]
    if dirs[0] is not None and dirs[0] == dirs[1]:
        raise SweepError(
            f"every trial would write the one run directory {dirs[0]}: drop run_dir=, each trial then gets its own"
        )


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, like every other bad input
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = _Parser(
        prog="posenc-lab sweep",
        description="Run a wandb sweep file with wandb's sweep engine, no server needed (wandb logs offline).",
    )
    parser.add_argument("sweep", help="the sweep file, e.g. sweeps/bayes_xl.yaml")
    parser.add_argument("--count", type=int, help="trials in the sweep in all (grid: default every grid point)")
    parser.add_argument("--jobs", type=int, default=1, help="trials running at once (default 1)")
    parser.add_argument("--out", help="the sweep's folder: grid.json, the table, logs (default runs/sweep-NAME)")
    parser.add_argument(
        "--devices", help="GPUs for the job slots, e.g. 0,1,2,3: slot i runs with CUDA_VISIBLE_DEVICES=the i-th (mod)"
    )
    parser.add_argument("--kill-after", type=float, default=30.0, help="seconds a trial gets to stop (default 30)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every trial, e.g. model=tiny trainer=cpu")
    return parser.parse_intermixed_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out or f"runs/sweep-{Path(args.sweep).stem}").resolve()
    with contextlib.ExitStack() as held:
        try:
            with stop_at_once(tuple(EXIT_CODES), raising=_StoppedBeforeTrials):  # the runner then has its own
                if args.count is not None and args.count < 1:
                    raise SweepError(f"--count {args.count}: a sweep runs at least one trial")
                if args.jobs < 1:
                    raise SweepError(f"--jobs {args.jobs}: at least one trial runs at a time")
                check_sweep(args.sweep, require_wandb=False)
                sweep = load_sweep(args.sweep)
                check_inputs(sweep, args.overrides, args.count, out)
                state = SweepState.open(out, sweep.path, sweep.spec, args.overrides)
                try:  # one runner per sweep folder: the lock of a run folder and of ablate's (runlock.py)
                    held.enter_context(RunLock(out, key="--out"))
                except RunDirError as e:
                    raise SweepError(str(e)) from None
                # the command that continues the sweep, from any folder: the sweep file's path absolute too
                again = ["posenc-lab", "sweep", str(Path(args.sweep).resolve()), "--out", str(out)]
                again += [f"--count={args.count}"] * (args.count is not None)
                again += [f"--jobs={args.jobs}"] * (args.jobs > 1) + [f"--devices={args.devices}"] * bool(args.devices)
                runner = Runner(
                    sweep, state, args.overrides, args.count, args.jobs,
                    kill_after=args.kill_after, again=shlex.join(again + args.overrides),
                    devices=args.devices.split(",") if args.devices else None,
                )  # fmt: skip
        except SweepError as e:
            print(f"posenc-lab sweep: error: {bounded(_one_line(str(e)))}", file=sys.stderr)
            return 2
        except _StoppedBeforeTrials as e:
            print(f"posenc-lab sweep: stopped by {signal_name(e.signum)} before any trial ran", file=sys.stderr)
            return EXIT_CODES[e.signum]
        return runner.run()  # its own handlers from its first line: they stop the running trials


class _StoppedBeforeTrials(BaseException):
    """A stop signal during the checks. Not an Exception, as KeyboardInterrupt is not: the checks and Hydra's
    compose take an Exception raised inside them for a config that does not compose."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _one_line(text: str) -> str:
    head, *items = text.split("\n  - ")
    return head + (" " + "; ".join(i.strip() for i in items) if items else "")
