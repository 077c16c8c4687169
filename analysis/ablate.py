"""``posenc-lab ablate [experiment=NAME] [overrides]``: the main job.

Trains the grid of a preset (the schemes of ``ablate.schemes`` with and without memory, the loss
variants and the optional recall grid it asks for), each cell once per seed, then runs every
analysis and writes the report:

    <ablate.out>/runs/<scheme>_mem<M>_<loss>_seed<S>/   one `posenc-lab train` run directory each
    <ablate.out>/report/report.md                        the report, its CSVs and PNGs
    <ablate.out>/ablate_times.json                       wall and CPU seconds of every run

Config: conf/ablate.yaml (which composes conf/train.yaml) and a preset from conf/experiment/
(`ablation` by default, `quick` as a smoke run of a few minutes, `wt103_table6` for the paper's
setting on GPUs). Each run is composed exactly as
``posenc-lab train experiment=NAME <overrides> posenc=S model.mem_len=M model.loss_recent_frac=F seed=S``.
``ablate.jobs=N`` trains N runs at once, each its own process with ``ablate.threads`` torch threads.

It resumes: a run whose results.json exists is reused (its config must match), an interrupted one
continues from its last checkpoint. Ctrl-C stops cleanly and prints the command that continues.

    posenc-lab ablate experiment=quick
    posenc-lab ablate experiment=ablation ablate.out=runs/my_ablation trainer.max_steps=800
    posenc-lab ablate --plan experiment=quick       # the run plan (--cfg: and the composed config)
    posenc-lab ablate --train-only                  # train the grid, no analysis or report
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from posenc_lab import config_dir

CONF_DIR = config_dir()
# Keys that decide what a run is: a finished run is reused only if these match.
IDENTITY = ("posenc", "model", "data", "optim", "seed")
FLAGS = ("--cfg", "--plan", "--train-only")


@dataclass
class RunSpec:
    name: str
    group: str  # "main" | "recall"
    scheme: str
    mem_len: int
    loss_frac: float
    overrides: list[str]
    seed: int = 0

    @property
    def loss(self) -> str:
        return "full" if self.loss_frac >= 1 else "half" if self.loss_frac == 0.5 else f"recent{self.loss_frac:g}"

    @property
    def cell(self) -> str:
        """The cell of the grid this run is one seed of: `[recall/]<scheme>:<mem|nomem>[:<loss>]`."""
        return cell_name(self.group, self.scheme, self.mem_len > 0, self.loss_frac)

    @property
    def label(self) -> str:
        loss = "full" if self.loss == "full" else "half" if self.loss == "half" else f"recent {self.loss_frac:g}"
        return f"{self.scheme}, mem {self.mem_len}, {loss} loss, seed {self.seed}" + (
            " (recall)" if self.group == "recall" else ""
        )


def cell_name(group: str, scheme: str, recurrent: bool, frac: float) -> str:
    loss = "" if frac >= 1 else ":half" if frac == 0.5 else f":recent{frac:g}"
    return f"{'recall/' if group == 'recall' else ''}{scheme}:{'mem' if recurrent else 'nomem'}{loss}"


def _split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    flags = [a for a in argv if a.startswith("--")]
    return flags, [a for a in argv if not a.startswith("--")]


def compose(name: str, overrides: Sequence[str]) -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        return hydra_compose(name, overrides=list(overrides))


def experiment_of(overrides: Sequence[str]) -> str:
    for o in overrides:
        if o.startswith("experiment="):
            return o.split("=", 1)[1]
    return "ablation"


def train_overrides(overrides: Sequence[str]) -> list[str]:
    """The user's overrides that concern training (not the ablate block)."""
    return [o for o in overrides if not o.lstrip("+~").startswith("ablate.") and not o.startswith("experiment=")]


def _int_list(value, key: str) -> list[int]:
    items = list(value or [])
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in items) or len(set(items)) != len(items):
        raise ValueError(f"ablate: {key} must be a list of distinct integer seeds, got {items}")
    return items


def plan(cfg: DictConfig, user: Sequence[str]) -> list[RunSpec]:
    """The grid of runs: schemes x recurrence (full loss), the half-loss variants, the recall grid;
    each cell once per seed of ``ablate.seeds``, and the cells of ``ablate.extra_seed_cells`` also
    once per seed of ``ablate.extra_seeds``, ordered seed by seed. Without memory: only the schemes
    of ``ablate.no_memory_schemes`` (null: all), in both grids. Bad settings raise ValueError
    before any training."""
    from posenc_lab.data.corpora import check_corpus_options
    from posenc_lab.positional import SCHEME_NAMES

    a = cfg.ablate
    base = [f"experiment={experiment_of(user)}", *train_overrides(user)]
    seeds = _int_list(a.get("seeds") if a.get("seeds") is not None else [int(cfg.seed)], "ablate.seeds")
    if not seeds:
        raise ValueError("ablate: ablate.seeds is empty; give at least one seed, e.g. ablate.seeds=[0]")
    extra_seeds = _int_list(a.get("extra_seeds"), "ablate.extra_seeds")
    extra_cells = list(a.get("extra_seed_cells") or [])
    no_memory = a.get("no_memory_schemes")
    named = {
        "ablate.schemes": list(a.schemes),
        "ablate.no_memory_schemes": list(no_memory or []),
        "ablate.half_loss.schemes": list((a.get("half_loss") or {}).get("schemes") or []),
        "ablate.recall.schemes": list((a.get("recall") or {}).get("schemes") or []),
    }
    for key, names in named.items():
        bad = [n for n in names if n not in SCHEME_NAMES]
        if bad:
            raise ValueError(f"ablate: {key} names unknown scheme(s) {bad}; valid: {', '.join(SCHEME_NAMES)}")
    specs: list[RunSpec] = []

    raw_scheme_overrides = (
        OmegaConf.to_container(a.scheme_overrides, resolve=False) if a.get("scheme_overrides") else {}
    )

    def add(group: str, scheme: str, recurrent: bool, frac: float, head: list[str], mem: int, group_cfg: DictConfig):
        M = mem if recurrent else 0
        cell = cell_name(group, scheme, recurrent, frac)
        # ${...} in a scheme override resolves against the run's own group config (main or recall)
        per_scheme = [_resolve_in(group_cfg, o) for o in raw_scheme_overrides.get(scheme) or []]
        for seed in dict.fromkeys([*seeds, *(extra_seeds if cell in extra_cells else [])]):
            overrides = [
                *head,
                f"posenc={scheme}",
                *per_scheme,
                f"model.mem_len={M}",
                f"model.loss_recent_frac={frac}",
                f"seed={seed}",
            ]
            spec = RunSpec("", group, scheme, M, frac, overrides, seed)
            spec.name = f"{'recall_' if group == 'recall' else ''}{scheme}_mem{M}_{spec.loss}_seed{seed}"
            specs.append(spec)

    mem = int(cfg.model.mem_len)
    if mem < 1 and any(a.recurrence):
        raise ValueError(
            "ablate: the runs with memory need model.mem_len >= 1 in the preset (got "
            f"{mem}); set model.mem_len or ablate.recurrence=[false]"
        )
    check_corpus_options(cfg.data.name, cfg.data.get("corpus") or {})
    for scheme in a.schemes:
        for rec in a.recurrence:
            if rec or no_memory is None or scheme in no_memory:
                add("main", scheme, bool(rec), 1.0, base, mem, cfg)
    half = a.get("half_loss") or {}
    for scheme in half.get("schemes") or []:
        for rec in half.get("recurrence") or [True]:
            add("main", scheme, bool(rec), 0.5, base, mem, cfg)
    recall = a.get("recall") or {}
    if recall.get("schemes"):
        # The recall grid is defined by its own data: the user's data overrides (data=textfile,
        # data.corpus.path=...) are for the main grid only.
        head = [
            f"experiment={recall.get('experiment') or 'recall'}",
            *[o for o in train_overrides(user) if not o.lstrip("+~").startswith("data")],
            *(recall.get("overrides") or []),
        ]
        rcfg = compose("train", head)
        check_corpus_options(rcfg.data.name, rcfg.data.get("corpus") or {})
        for scheme in recall.schemes:
            for rec in recall.get("recurrence") or [True, False]:
                if rec or no_memory is None or scheme in no_memory:
                    add("recall", scheme, bool(rec), 1.0, head, int(rcfg.model.mem_len), rcfg)
    cells = list(dict.fromkeys(s.cell for s in specs))
    unknown = [c for c in extra_cells if c not in cells]
    if unknown:
        raise ValueError(
            f"ablate: ablate.extra_seed_cells names cells not in the grid: {unknown}; the grid's "
            f"cells: {', '.join(cells)}"
        )
    # seed by seed: an interrupted job has first finished every cell once
    rank = {seed: i for i, seed in enumerate(dict.fromkeys([*seeds, *extra_seeds]))}
    specs.sort(key=lambda s: rank[s.seed])
    names = [s.name for s in specs]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"ablate: the grid names runs twice: {sorted(dup)}")
    return specs


def seeds_by_cell(specs: Sequence[RunSpec]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for s in specs:
        out.setdefault(s.cell, []).append(s.seed)
    return out


def _resolve_in(cfg: DictConfig, text: str) -> str:
    """Resolve the ${...} interpolations of ``text`` against ``cfg``."""
    if "${" not in text:
        return text
    root = OmegaConf.to_container(cfg, resolve=False)
    node = OmegaConf.create({"root": root, "value": text.replace("${", "${root.")})
    return str(node.value)


def _identity(cfg) -> dict:
    c = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
    out = {k: c.get(k) for k in IDENTITY}
    out["max_steps"] = (c.get("trainer") or {}).get("max_steps")
    return out


def _diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    keys = sorted(set(a) | set(b))
    out = []
    for k in keys:
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _diff(va, vb, f"{prefix}{k}.")
        elif va != vb:
            out.append(f"{prefix}{k}: {va!r} (finished run) vs {vb!r} (now)")
    return out


def _run_cfg(spec: RunSpec, run_dir: Path) -> DictConfig:
    cfg = compose("train", [*spec.overrides, f"run_dir={run_dir}"])
    with open_dict(cfg):
        cfg.pop("ablate", None)
    return cfg


def _prepare(spec: RunSpec, run_dir: Path, retrain: bool) -> tuple[str, DictConfig]:
    """What this run needs: "reused" (finished with the same settings), "resumed" or "trained".
    A finished run with other settings is an error (nothing is overwritten unless ``retrain``)."""
    import shutil

    import yaml

    cfg = _run_cfg(spec, run_dir)
    last = run_dir / "checkpoints" / "last.ckpt"
    if (run_dir / "results.json").is_file() and last.is_file() and not retrain:
        saved = yaml.safe_load((run_dir / "config.yaml").read_text())
        diff = _diff(_identity(saved), _identity(cfg))
        if diff:
            raise ValueError(
                f"ablate: {run_dir} holds a finished run with other settings ({'; '.join(diff[:6])}). "
                f"Use another ablate.out, or ablate.retrain=true to train it again"
            )
        return "reused", cfg
    if retrain and run_dir.exists():
        shutil.rmtree(run_dir)
    return ("resumed" if last.is_file() else "trained"), cfg


def _is_ddp(cfg: DictConfig) -> bool:
    return "ddp" in str(cfg.trainer.get("strategy") or "")


def _train_command(spec: RunSpec, run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "posenc_lab.train", *spec.overrides, f"run_dir={run_dir}"]


def _train_here(spec: RunSpec, run_dir: Path, retrain: bool) -> dict:
    """Train one run in this process (or reuse it): {"status", "wall_s", "cpu_s"}."""
    status, cfg = _prepare(spec, run_dir, retrain)
    if status == "reused":
        return {
            "status": status,
            "wall_s": float(json.loads((run_dir / "results.json").read_text()).get("wall_time_s") or 0.0),
            "cpu_s": None,
        }
    wall, cpu = time.perf_counter(), time.process_time()
    if _is_ddp(cfg):
        # DDP launches its ranks by re-running the command line, so each run gets its own
        # `posenc_lab.train` process rather than re-running the whole ablation per rank.
        subprocess.run(_train_command(spec, run_dir), check=True)
    else:
        from posenc_lab.train import train

        try:
            train(cfg)
        except SystemExit as e:
            # Lightning turns Ctrl-C into "ignore further SIGINT, sys.exit(1)": make it Ctrl-C again.
            if _INTERRUPTED:
                signal.signal(signal.SIGINT, _on_sigint)
                raise KeyboardInterrupt from e
            raise
    return {"status": status, "wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}


def train_one(spec: RunSpec, run_dir: Path, retrain: bool, log=None) -> tuple[str, float]:
    """Train one run in this process (or reuse it); returns (status, wall seconds)."""
    t = _train_here(spec, run_dir, retrain)
    return t["status"], t["wall_s"]


_INTERRUPTED = False


def _on_sigint(signum, frame):
    global _INTERRUPTED
    _INTERRUPTED = True
    raise KeyboardInterrupt


@dataclass
class Progress:
    """Where the job is, for the progress lines and for the message after Ctrl-C."""

    total: int
    stage: str = "planning"
    running: tuple[str, ...] = ()
    done: int = 0


def _result_line(run_dir: Path) -> str:
    res = json.loads((run_dir / "results.json").read_text())
    val = res.get("val") or {}
    fig = next((f", val {k} {val[k]:.4f}" for k in ("bpt", "ppl", "acc") if k in val), "")
    return f"{res.get('steps')} steps{fig}"


def _seconds(t: dict) -> str:
    return f"{t['wall_s']:.0f} s" + (f", CPU {t['cpu_s']:.0f} s" if t.get("cpu_s") is not None else "")


def train_sequential(specs: list[RunSpec], runs: Path, retrain: bool, progress: Progress, log) -> dict[str, dict]:
    times: dict[str, dict] = {}
    for i, spec in enumerate(specs, 1):
        run_dir = runs / spec.name
        trained = [t["wall_s"] for t in times.values() if t["status"] != "reused"]
        eta = ""
        if trained:
            left = sum(1 for sp in specs[i - 1 :] if not (runs / sp.name / "results.json").is_file())
            eta = f", about {left * sum(trained) / len(trained) / 60:.1f} min of training left"
        reuse = (run_dir / "results.json").is_file() and not retrain
        log(f"[{i}/{len(specs)}] {spec.label}: {'reusing' if reuse else 'training'}{eta}")
        progress.running = (spec.name,)
        times[spec.name] = t = _train_here(spec, run_dir, retrain)
        progress.running, progress.done = (), progress.done + 1
        log(f"[{i}/{len(specs)}] {spec.name}: {t['status']} ({_seconds(t)}, {_result_line(run_dir)})")
    return times


def train_parallel(
    specs: list[RunSpec], runs: Path, retrain: bool, jobs: int, threads: int | None, progress: Progress, log
) -> dict[str, dict]:
    """Train up to ``jobs`` runs at once, each its own ``posenc_lab.train`` process (output in
    <out>/logs/<run>.log), with ``threads`` torch threads each. CPU seconds from each child's rusage."""
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    logs = runs.parent / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    times: dict[str, dict] = {}
    index = {spec.name: i for i, spec in enumerate(specs, 1)}
    pending = list(specs)
    running: dict[int, tuple[RunSpec, subprocess.Popen, float, str]] = {}  # pid -> spec, process, start, status

    def show():
        progress.running = tuple(sp.name for sp, *_ in running.values())
        return f"running: {', '.join(progress.running) or 'none'}; done {progress.done}/{len(specs)}"

    try:
        while pending or running:
            while pending and len(running) < jobs:
                spec = pending.pop(0)
                run_dir = runs / spec.name
                status, _ = _prepare(spec, run_dir, retrain)
                if status == "reused":
                    times[spec.name] = {"status": status, "wall_s": 0.0, "cpu_s": None}
                    progress.done += 1
                    log(f"[{index[spec.name]}/{len(specs)}] {spec.name}: reused ({_result_line(run_dir)})")
                    continue
                with open(logs / f"{spec.name}.log", "ab") as out:
                    proc = subprocess.Popen(
                        _train_command(spec, run_dir), env=env, stdout=out, stderr=subprocess.STDOUT
                    )
                running[proc.pid] = (spec, proc, time.perf_counter(), status)
                log(
                    f"[{index[spec.name]}/{len(specs)}] {spec.label}: {status.replace('ed', 'ing')} "
                    f"(pid {proc.pid}; {show()})"
                )
            finished = []
            for pid, (_, proc, *_) in running.items():
                got, wait_status, usage = os.wait4(pid, os.WNOHANG)
                if got:
                    proc.returncode = os.waitstatus_to_exitcode(wait_status)
                    finished.append((pid, usage))
            for pid, usage in finished:
                spec, proc, start, status = running.pop(pid)
                t = {"status": status, "wall_s": time.perf_counter() - start, "cpu_s": usage.ru_utime + usage.ru_stime}
                if proc.returncode != 0:
                    tail = (logs / f"{spec.name}.log").read_text(errors="replace").strip().splitlines()[-15:]
                    raise RuntimeError(
                        f"training {spec.name} exited with code {proc.returncode}; the end of its "
                        f"log {logs / f'{spec.name}.log'}:\n  " + "\n  ".join(tail)
                    )
                times[spec.name] = t
                progress.done += 1
                log(
                    f"[{index[spec.name]}/{len(specs)}] {spec.name}: {status} ({_seconds(t)}, "
                    f"{_result_line(runs / spec.name)}; {show()})"
                )
            if running and not finished:
                time.sleep(0.5)
    finally:
        _stop(running)
    return times


def _stop(running: dict) -> None:
    """Stop the training processes still running (after Ctrl-C or a failed run): SIGINT, which
    Lightning handles by shutting down cleanly, then SIGKILL after 30 s."""
    for _, proc, *_ in running.values():
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 30
    for _, proc, *_ in running.values():
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        except ChildProcessError:  # already reaped by os.wait4
            pass


def _checkpoint_step(run_dir: Path) -> int | None:
    last = run_dir / "checkpoints" / "last.ckpt"
    if not last.is_file():
        return None
    try:
        from posenc_lab.lit import read_checkpoint

        return int(read_checkpoint(last)["global_step"])
    except Exception:  # noqa: BLE001 - a checkpoint cut short by the interrupt: training starts again
        return None


def continue_command(overrides: Sequence[str], out: Path) -> str:
    """The command that continues this job from anywhere: the same overrides, the output folder made
    absolute, and no retrain (which would throw away the runs it is meant to continue)."""
    keep = [o for o in overrides if not o.startswith(("ablate.out=", "ablate.retrain="))]
    return "posenc-lab ablate " + shlex.join([*keep, f"ablate.out={out}"])


def interrupted_message(progress: Progress, specs: Sequence[RunSpec], out: Path, overrides: Sequence[str]) -> str:
    runs = out / "runs"
    finished = [s.name for s in specs if (runs / s.name / "results.json").is_file()]
    lines = [
        f"posenc-lab ablate: interrupted (Ctrl-C) during {progress.stage}"
        + (f" of {', '.join(progress.running)}" if progress.running else "")
        + "."
    ]
    lines.append(
        f"Kept: {len(finished)} of {len(specs)} runs finished in {runs}"
        + (" (each reused when you continue)." if finished else ".")
    )
    for name in progress.running:
        if progress.stage == "training" and name not in finished:
            step = _checkpoint_step(runs / name)
            lines.append(
                f"  {name}: "
                + (
                    f"continues from its checkpoint at step {step}."
                    if step is not None
                    else "no checkpoint yet; it trains again from the start."
                )
            )
    if progress.stage.startswith("analysis"):
        lines.append(f"The report in {out / 'report'} is not complete; it is written again when you continue.")
    lines.append(f"Continue with: {continue_command(overrides, out)}")
    return "\n".join(lines)


def _quiet() -> None:
    """Keep the progress readable: Lightning's per-run banners (accelerator, tips) off."""
    import lightning.pytorch  # noqa: F401 - it sets its loggers' levels on import; override after

    for name in (
        "lightning",
        "lightning.pytorch",
        "lightning.fabric",
        "lightning.pytorch.utilities.rank_zero",
        "lightning.fabric.utilities.rank_zero",
        "posenc_lab.train",
    ):
        logging.getLogger(name).setLevel(logging.WARNING)
    for msg in (
        ".*IterableDataset.*has `__len__` defined.*",
        ".*isinstance\\(treespec, LeafSpec\\).*",
        ".*limit_test_batches=1.0.*",
        ".*does not have many workers.*",
        ".*litlogger.*",
    ):
        warnings.filterwarnings("ignore", message=msg)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    flags, overrides = _split_argv(argv)
    if "--help" in flags or "-h" in argv:
        print(__doc__)
        return 0
    unknown = [f for f in flags if f not in FLAGS]
    if unknown:
        print(
            f"posenc-lab ablate: unknown option(s) {unknown}; options: {', '.join(FLAGS)}, --help; the rest are "
            f"Hydra overrides (experiment=NAME, ablate.KEY=VALUE, any training key)",
            file=sys.stderr,
        )
        return 2
    try:
        cfg = compose("ablate", overrides)
        specs = plan(cfg, overrides)
        if "--train-only" not in flags:  # the analysis settings are checked before any training too
            from .report import ReportSettings

            ReportSettings.from_dict(OmegaConf.to_container(cfg.ablate.analysis, resolve=True))
        jobs = int(cfg.ablate.get("jobs") or 1)
        if jobs < 1:
            raise ValueError(f"ablate.jobs must be >= 1, got {jobs}")
        if jobs > 1 and _is_ddp(cfg):
            raise ValueError(
                f"ablate.jobs={jobs} with a DDP trainer: each run already takes every device; set ablate.jobs=1"
            )
    except Exception as e:  # noqa: BLE001 - Hydra raises several kinds for bad overrides
        print(f"posenc-lab ablate: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    a = cfg.ablate
    out = Path(a.out).resolve()
    if "--cfg" in flags or "--plan" in flags:
        if "--cfg" in flags:
            print(OmegaConf.to_yaml(cfg))
        print(f"# {len(specs)} runs into {out}/runs ({jobs} at a time):")
        for sp in specs:
            print(f"#   {sp.name}: posenc-lab train {' '.join(sp.overrides)}")
        return 0

    progress = Progress(len(specs))
    previous = signal.signal(signal.SIGINT, _on_sigint)
    try:
        return _run(cfg, specs, overrides, out, jobs, "--train-only" in flags, progress)
    except KeyboardInterrupt:
        print("\n" + interrupted_message(progress, specs, out, overrides), file=sys.stderr, flush=True)
        return 130
    finally:
        signal.signal(signal.SIGINT, previous)


def _run(
    cfg: DictConfig,
    specs: list[RunSpec],
    overrides: Sequence[str],
    out: Path,
    jobs: int,
    train_only: bool,
    progress: Progress,
) -> int:
    import torch

    from posenc_lab.io import read_json, write_json

    a = cfg.ablate
    if a.get("threads"):
        torch.set_num_threads(int(a.threads))
    _quiet()
    t0, cpu0 = time.perf_counter(), time.process_time()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:7.1f}s] {msg}", flush=True)

    log(
        f"ablate {a.name}: {len(specs)} runs -> {out}/runs; report -> {out}/report "
        f"({jobs} at a time, torch threads each: {a.get('threads') or 'default'})"
    )
    runs = out / "runs"
    progress.stage = "training"
    try:
        if jobs > 1:
            times = train_parallel(specs, runs, bool(a.retrain), jobs, a.get("threads"), progress, log)
        else:
            times = train_sequential(specs, runs, bool(a.retrain), progress, log)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001 - report which run failed, keep the finished ones
        log(f"training FAILED ({', '.join(progress.running) or 'before training'}): {type(e).__name__}: {e}")
        log(f"finished runs are kept in {runs}; continue with: {continue_command(overrides, out)}")
        return 1
    times_file = out / "ablate_times.json"
    recorded = read_json(times_file) if times_file.is_file() else {}
    recorded.update({k: v for k, v in times.items() if v["status"] != "reused"})
    write_json(times_file, recorded)
    fresh = [t for t in times.values() if t["status"] != "reused"]
    train_note = (
        f"{sum(t['wall_s'] for t in fresh):.0f} s wall / "
        f"{sum(t['cpu_s'] or 0 for t in fresh):.0f} s CPU of training in this invocation "
        f"({jobs} at a time), {len(specs) - len(fresh)} finished runs reused"
    )
    log(f"training done: {train_note}")
    if train_only:
        log(f"--train-only: no report; `{continue_command(overrides, out)}` writes it")
        return 0

    from .report import ReportSettings, build_report
    from .runs import load_run, sort_runs

    progress.stage, progress.running = "analysis and report", ()
    if a.get("threads") and jobs > 1:  # the analyses run alone: they get the cores the training runs had
        torch.set_num_threads(int(a.threads) * jobs)
    loaded = sort_runs([load_run(runs / sp.name) for sp in specs])
    settings = ReportSettings.from_dict(OmegaConf.to_container(a.analysis, resolve=True))
    command = "posenc-lab ablate " + " ".join(overrides) if overrides else "posenc-lab ablate"
    by_cell = seeds_by_cell(specs)
    multi = [c for c, s in by_cell.items() if len(s) > 1]
    notes = [
        f"Preset `{experiment_of(overrides)}` ({len(specs)} runs: {train_note}).",
        f"Seeds: {', '.join(map(str, sorted({s.seed for s in specs})))}; cells with several seeds: "
        f"{', '.join(multi) if multi else 'none'}.",
    ]
    path = build_report(
        loaded,
        out / "report",
        settings,
        title=f"posenc-lab ablation report: {a.name}",
        meta={"command": f"Command: `{command}`.", "notes": notes, "smoke": bool(a.get("smoke")), "seeds": by_cell},
        log=log,
    )
    if a.get("wandb_project"):
        from .report import log_to_wandb

        progress.stage = "wandb upload"
        log_to_wandb(path.parent, str(a.wandb_project), [runs], group=f"ablate-{a.name}")
        log(f"logged the report to wandb project {a.wandb_project}")
    log(
        f"done in {(time.perf_counter() - t0) / 60:.1f} min (this process: {(time.process_time() - cpu0) / 60:.1f} "
        f"CPU min; training processes: see {times_file.name}): {path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
