"""The ``posenc-lab ablate`` command (see the package docstring): plan, train, analyse, report."""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import sys
import time
import warnings
from collections.abc import Sequence

import lightning.pytorch
import torch
from omegaconf import OmegaConf

from posenc_lab_analysis.report import ReportSettings, build_report
from posenc_lab_analysis.runs import load_run, sort_runs

from ..compose import compose, grammar_problem
from ..errors import PosencLabError
from ..io import CorruptFileError
from ..rundir import RunDir, RunDirError
from .jobs import (
    Interrupted,
    Progress,
    RunFailed,
    continue_command,
    failed_advice,
    interrupted_message,
    raise_interrupted,
    run_jobs,
)
from .outdir import AblationDir
from .plan import check_grid, experiment_of, foreign_files, plan, seeds_by_cell, status

FLAGS = ("--cfg", "--plan", "--train-only")


def _quiet() -> None:
    """Keep the progress readable: Lightning's banners (accelerator, tips) off."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "posenc_lab.train"):
        logging.getLogger(name).setLevel(logging.WARNING)
    for msg in (
        ".*IterableDataset.*has `__len__` defined.*",
        ".*isinstance\\(treespec, LeafSpec\\).*",
        ".*does not have many workers.*",
    ):
        warnings.filterwarnings("ignore", message=msg)
    assert lightning.pytorch  # imported first: it sets its loggers' levels on import, overridden above


def _prepare(cfg, overrides: Sequence[str], flags: Sequence[str]):
    """(out, specs, statuses, jobs): everything checked before anything is trained or written."""
    a = cfg.ablate
    out = AblationDir(a.out)
    if problem := out.problem() or out.foreign():  # before anything is loaded, trained or written
        raise ValueError(problem)
    specs = plan(cfg, overrides)
    jobs = a.get("jobs")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"ablate.jobs must be an integer >= 1 (training processes at once), got {jobs!r}")
    threads = a.get("threads")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"ablate.threads must be null or an integer >= 1, got {threads!r}")
    if "--train-only" not in flags:  # the analysis settings are checked before any training too
        ReportSettings.read(OmegaConf.to_container(a.analysis, resolve=True))
    configs = check_grid(specs, out.runs)
    if jobs > 1 and any("ddp" in str(c.trainer.get("strategy") or "") for c in configs.values()):
        raise ValueError(
            f"ablate.jobs={jobs} with a DDP trainer: each run already takes every device; set ablate.jobs=1"
        )
    if problem := foreign_files(specs, out.runs):  # before retrain could delete them
        raise ValueError(problem)
    if a.retrain:
        return out, specs, {s.name: "trained" for s in specs}, jobs
    return out, specs, {s.name: status(s, configs[s.name], out.run(s.name)) for s in specs}, jobs


def _power_lines(cfg, specs) -> list[str]:
    """The plan's power statement (``power.plan_lines``): the seeds of its main corpus's cells, the files and
    families of the tokens the report's as-trained evaluation will score on its split (``dumps.scored_files``),
    the verdicts of conf/paper.yaml the report will judge on this grid (``power.judged``) and the measured
    components."""
    from posenc_lab_analysis.coverage import MEASURED
    from posenc_lab_analysis.dumps import scored_files
    from posenc_lab_analysis.power import judged, plan_lines
    from posenc_lab_analysis.runs import load_corpus_cached
    from posenc_lab_analysis.sections.verdicts import restricted
    from posenc_lab_analysis.verdicts import paper

    task_lines = _task_power_lines(cfg, specs)
    main_cells = [s for s in specs if not s.group]
    if not main_cells:
        return task_lines
    seeds = sorted({len(v) for k, v in seeds_by_cell(main_cells).items()})
    corpus = load_corpus_cached(cfg.data.name, cfg.data.get("root"), OmegaConf.to_container(cfg.data.corpus or {}))
    settings = ReportSettings.read(OmegaConf.to_container(cfg.ablate.analysis, resolve=True))
    shared = settings.shared
    tokens, family = scored_files(corpus, shared.trained, shared.split)
    verdicts_block = settings.blocks.get("verdicts")  # a preset that judges some verdicts alone (verdicts.only)
    config, _ = restricted(paper(), verdicts_block.only if verdicts_block else None)
    n_seeds: dict = {}
    for s in specs:
        n_seeds[s.cell_name] = n_seeds.get(s.cell_name, 0) + 1
    on = set(shared.sections)
    main, memory = (lambda c: c.group == ""), (lambda c: c.group == "" and c.memory)
    measures = {  # the measures the report's evidence will hold (report.Group.evidence and the sections')
        "as_trained": main,
        "attention_gain": memory,
        **({"position_gap": main} if "position" in on else {}),
        **({"context_gain": main} if "effective_context" in on else {}),
        **({"recall_beyond": lambda c: c.group == "recall"} if "recall" in on else {}),
    }
    n = len(judged(config, n_seeds, measures)) if "verdicts" in on else 0
    return plan_lines(tokens, family, seeds, n, float(config.get("alpha", 0.05)), MEASURED) + task_lines


def _task_power_lines(cfg, specs) -> list[str]:
    """The task grid's (ablate.tasks) power statement: its claims (ablate.analysis.lengthgen.claims) on the test
    instances the report evaluates a length (data.corpus.eval_instances, at most max_instances)."""
    from posenc_lab_analysis.sections.lengthgen import plan_lines as lengthgen_plan_lines

    tasks = [s for s in specs if s.group and s.group != "recall"]
    if not tasks:
        return []
    settings = cfg.ablate.analysis.lengthgen
    instances = int(cfg.data.corpus.get("eval_instances") or 0)
    if settings.get("max_instances"):
        instances = min(instances, int(settings.max_instances))
    return lengthgen_plan_lines({c: len(v) for c, v in seeds_by_cell(tasks).items()}, settings.claims, instances)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    flags = [x for x in argv if x.startswith("--")]
    overrides = [x for x in argv if not x.startswith("--")]
    if "--help" in flags or "-h" in argv:
        print(sys.modules["posenc_lab.ablate"].__doc__)
        return 0
    if unknown := [f for f in flags if f not in FLAGS]:
        print(
            f"posenc-lab ablate: unknown option(s) {unknown}; options: {', '.join(FLAGS)}, --help; the rest are "
            f"Hydra overrides (experiment=NAME, ablate.KEY=VALUE, any training key)",
            file=sys.stderr,
        )
        return 2
    if problem := grammar_problem("ablate", overrides, "ablate"):  # Hydra's own: a parser error of 5 lines
        print(f"posenc-lab ablate: error: {problem}", file=sys.stderr)
        return 2
    try:
        cfg = compose("ablate", overrides)
        out, specs, statuses, jobs = _prepare(cfg, overrides, flags)
    except (ValueError, PosencLabError) as e:
        print(f"posenc-lab ablate: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - Hydra raises several kinds for bad overrides: one line each
        print(f"posenc-lab ablate: error: {type(e).__name__}: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    if "--cfg" in flags or "--plan" in flags:
        if "--cfg" in flags:
            print(OmegaConf.to_yaml(cfg))
        print(f"# {len(specs)} runs into {out.runs} ({jobs} at a time):")
        for sp in specs:
            print(f"#   {sp.name} ({statuses[sp.name]}): posenc-lab train {' '.join(sp.overrides)}")
        if "--plan" in flags:
            try:
                print("\n".join(_power_lines(cfg, specs)))
            except (ValueError, PosencLabError) as e:
                print(f"posenc-lab ablate: error: the power statement: {e}", file=sys.stderr)
                return 2
        return 0
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(out.lock())  # one ablate at a time writes the folder
        except RunDirError as e:
            print(f"posenc-lab ablate: error: {e}", file=sys.stderr)
            return 2
        progress = Progress(len(specs))
        previous = {s: signal.signal(s, raise_interrupted) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            return _run(cfg, specs, statuses, overrides, out, jobs, "--train-only" in flags, progress)
        except (Interrupted, KeyboardInterrupt) as e:
            signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
            print("\n" + interrupted_message(signum, progress, specs, out, overrides), file=sys.stderr, flush=True)
            return 128 + signum
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


def _run(cfg, specs, statuses, overrides, out: AblationDir, jobs: int, train_only: bool, progress: Progress) -> int:
    a = cfg.ablate
    _quiet()
    t0, cpu0 = time.perf_counter(), time.process_time()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:7.1f}s] {msg}", flush=True)

    log(
        f"ablate {a.name}: {len(specs)} runs -> {out.runs}; report -> {out.report} ({jobs} at a time, "
        f"{a.get('threads') or 'all'} torch thread(s) each)"
    )
    try:  # the folder's first write, under its lock: the mark, in grid.json (outdir.py)
        ledger = out.claim(log)
    except CorruptFileError as e:  # grid.json damaged since ``foreign`` read it: whose folder it is is unknown
        print(f"posenc-lab ablate: error: {e}", file=sys.stderr)
        return 2
    if a.retrain:
        for spec in specs:
            shutil.rmtree(out.run(spec.name), ignore_errors=True)
            ledger.drop(spec.name)
    progress.stage = "training"
    try:
        times = run_jobs(specs, statuses, out, jobs, a.get("threads"), progress, log, ledger)
    except RunFailed as e:
        log(f"training FAILED: {e}")
        log(failed_advice(e, sum(1 for s in specs if RunDir(out.run(s.name)).finished), overrides, out))
        return 1
    fresh = [t for t in times.values() if t["status"] != "reused"]
    train_note = (
        f"{sum(t['wall_s'] for t in fresh):.0f} s real / {sum(t['cpu_s'] or 0 for t in fresh):.0f} s CPU of training "
        f"in this invocation ({jobs} at a time), {len(specs) - len(fresh)} finished runs reused"
    )
    log(f"training done: {train_note}")
    if train_only:
        log(f"--train-only: no report; `{continue_command(overrides, out)}` writes it")
        return 0
    progress.stage, progress.running = "analysis and report", ()
    if a.get("threads"):  # the analyses run alone: they get the cores the training runs had
        torch.set_num_threads(int(a.threads) * jobs)
    loaded = sort_runs([load_run(out.run(sp.name)) for sp in specs])
    settings = ReportSettings.read(OmegaConf.to_container(a.analysis, resolve=True))
    multi = [c for c, s in seeds_by_cell(specs).items() if len(s) > 1]
    notes = [
        f"Preset `{experiment_of(overrides)}` ({len(specs)} runs: {train_note}).",
        f"Seeds: {', '.join(map(str, sorted({s.seed for s in specs})))}; cells with several seeds: "
        f"{', '.join(multi) or 'none'}.",
    ]
    command = "posenc-lab ablate" + ("" if not overrides else " " + " ".join(overrides))
    new = out.new_report()  # swapped in for report/ when complete (outdir's docstring)
    path = build_report(
        loaded,
        new,
        settings,
        title=f"posenc-lab ablation report: {a.name}",
        meta={"command": f"Command: `{command}`.", "notes": notes, "smoke": bool(a.get("smoke"))},
        log=log,
        jobs=jobs,  # the runs' dumps in as many processes as trained at once, with their threads
        threads=a.get("threads"),
    )
    path = out.publish_report(new) / path.relative_to(new)
    if a.get("wandb_project"):
        from posenc_lab_analysis.wandb_upload import upload  # wandb loads only when asked for

        progress.stage = "wandb upload"
        upload(path.parent, [out.runs], project=str(a.wandb_project), group=f"ablate-{a.name}")
        log(f"logged the report to wandb project {a.wandb_project}")
    log(
        f"done in {(time.perf_counter() - t0) / 60:.1f} min (this process: "
        f"{(time.process_time() - cpu0) / 60:.1f} CPU min): {path}"
    )
    return 0
