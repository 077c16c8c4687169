"""Training entry point (Hydra): ``python -m posenc_lab.train posenc=xl data=recall trainer.max_steps=200``.

``posenc-lab train ...`` runs the same thing. The run directory (Hydra's, or ``run_dir=...``) gets:

    run.json           the run's identity (see rundir.py): a run directory holds one run
    .hydra/            Hydra's composed config, overrides (written once the checks have passed)
    config.yaml        the resolved config of this run
    metrics.csv        metric log (logger=csv; hparams.yaml next to it)
    wandb_id, wandb/   the run's wandb run id, which a resumed run continues, and wandb's files (logger=wandb)
    checkpoints/       last.ckpt; good.ckpt, good.prev.ckpt: the newest two good ones (checkpoints.Checkpointing)
                       (+ periodic ones with callbacks.checkpoint.save_top_k=-1)
    results.json       final validation and test figures (see ``train``)

Rerunning with the same run directory resumes from its last.ckpt (``resume=auto``) if the run is
the same (rundir.py); a longer ``trainer.max_steps`` extends it, keeping its learning-rate schedule
(optim.py). Every config value, the data, the run directory and the checkpoint are checked before
anything is written; a second process writing the same run directory is refused (``.lock``). In a
sweep (``-m``) every job gets its own run directory: ``run_dir/<job number>_<scheme>_<data>``
(hydra.sweep.subdir).

SIGTERM, SIGINT and SIGHUP (and, in a SLURM job, its requeue signal) stop training at the end of the step, or of
the validation batch, with last.ckpt saved (checkpoints.Checkpointing), print one line with the command that
continues the run and exit 143 / 130 / 129; see docs/CLUSTERS.md, "Time limits, preemption, requeue".
A run that ends unhealthy (a divergence to a finite loss) warns in one line and exits 0 (``_unhealthy``).
A new run that fails before its first step removes what it wrote (``RunDir.remove_new``): a corrected rerun into
the same run_dir is not "another run". Memory running out is one line naming the sizes and the checkpoint kept
(memory_line.py, errors.reported).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shlex
import signal
import sys
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from . import config_dir, flush_denormals, keep_freed_memory, tracking
from .build import build_datamodule, build_lit, build_trainer, check_splits, model_config
from .checkpoints import CHECKPOINT_SAFE_GLOBALS, SANE_LOSS_RATIO, Checkpointing, CheckpointUnreadable
from .checks import check, problems
from .compose import MULTIRUN_FLAGS, grammar_problem, job_problems, override_problem
from .datamodule import SegmentDataModule
from .distributed import lost_process
from .errors import ConfigError, Interrupted, OverrideError, reported, stop_at_once
from .footprint import train_problem
from .io import path_problem, remove_partial, write_text
from .lit import LitLM
from .memory_line import train_advice
from .precision import check_precision
from .resume import check_folders, check_resumable, checkpoint_state, resume_path
from .rundir import (
    Results,
    RunDir,
    RunDirError,
    absolute_paths,
    corpus_identity,
    in_multirun,
    named_run_dir,
    run_identity,
)
from .slurm import in_slurm_job, requeue, stop_signals, submitit_signal

log = logging.getLogger("posenc_lab.train")
# The run directory already holds config.yaml and .hydra/ when the CSV log starts: not a problem.
warnings.filterwarnings("ignore", message="Experiment logs directory .* exists and is not empty")
CONF_DIR = config_dir()


def _own_log() -> tuple[str, ...]:
    """The name of this command's Hydra log file (``train.log``), which a warning before the run-dir checks
    (e.g. about bf16 on this CPU) has already created in a fresh run_dir."""
    return (f"{HydraConfig.get().job.name}.log",) if HydraConfig.initialized() else ()


def _keep_old_log(run: RunDir, step: int) -> None:
    """CSVLogger would delete the log of an interrupted part: keep it under another name."""
    if run.metrics_file.exists():
        target, n = run.path / f"metrics.until_step{step}.csv", 1
        while target.exists():
            target, n = run.path / f"metrics.until_step{step}.{n}.csv", n + 1
        run.metrics_file.rename(target)


def _write_run_start(cfg: DictConfig, composed: DictConfig, run: RunDir) -> None:
    """config.yaml, and .hydra/ as Hydra would write it (train.yaml sets hydra.output_subdir: null so
    that Hydra writes nothing into the run directory before the checks have passed)."""
    write_text(run.config_file, OmegaConf.to_yaml(cfg, resolve=True))
    if HydraConfig.initialized():
        hc = HydraConfig.get()
        hydra_dir = run.hydra_dir
        write_text(hydra_dir / "config.yaml", OmegaConf.to_yaml(composed))
        write_text(hydra_dir / "hydra.yaml", OmegaConf.to_yaml(OmegaConf.create({"hydra": hc})))
        write_text(hydra_dir / "overrides.yaml", OmegaConf.to_yaml(hc.overrides.task))


_DDP_ENV = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _prepare_ddp_relaunch(run_dir: Path) -> None:
    """Lightning's DDP launcher re-runs ``sys.argv`` for ranks > 0 with hydra.run.dir set to Hydra's
    run dir. Inside a multirun job that would start the whole sweep again in every rank: hand it this
    job's own overrides and run directory instead."""
    if in_multirun():
        hc = HydraConfig.get()
        sys.argv = [sys.argv[0], *[o for o in hc.overrides.task if not o.startswith("run_dir=")], f"run_dir={run_dir}"]
        with read_write(hc), open_dict(hc):
            hc.run.dir = hc.runtime.output_dir


def _end_local_ddp(env_before: set[str]) -> None:
    """After a DDP job of a local multirun, the next job in this process must start its own ranks:
    drop the process group and the rank variables Lightning's launcher set."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    for key in _DDP_ENV:
        if key not in env_before:
            os.environ.pop(key, None)


# ---- the run -----------------------------------------------------------------------------------


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train as configured, evaluate on val and test, write results.json; return the results."""
    composed = cfg.copy()  # as Hydra composed it, for .hydra/config.yaml
    run_dir = named_run_dir(cfg)
    with open_dict(cfg):
        cfg.run_dir = str(run_dir)

    # Everything that can be checked is checked before anything is written (and before DDP launches).
    check(cfg, "train")
    data = OmegaConf.to_container(cfg.data, resolve=True)
    for key, value in (absolute_paths(data).get("corpus") or {}).items():  # run.json, config.yaml and checkpoints
        if value != data["corpus"][key]:  # then name the corpus from any folder (eval, compare)
            cfg.data.corpus[key] = value
    check_folders(cfg, RunDir(run_dir))
    L.seed_everything(int(cfg.seed), workers=True, verbose=False)
    datamodule = build_datamodule(cfg.data)
    check_splits(datamodule)
    if problem := train_problem(cfg, model_config(cfg, datamodule.vocab_size)):  # its vocabulary now
        raise ConfigError(problem)
    lit = build_lit(cfg, datamodule)
    lit.check_data(datamodule, ("train", "val"))
    if cfg.get("compile", False):  # in place: the state_dict keys (checkpoints) stay those of the eager model
        if slower := lit.model.scheme.compile_slower:
            log.warning(f"compile=true with posenc={cfg.posenc.name}: {slower}")
        lit.model.compile()
    run = RunDir(run_dir)
    identity = run_identity(OmegaConf.to_container(cfg, resolve=True), corpus_identity(datamodule.corpus))
    record = run.check(identity, _own_log())
    seen = checkpoint_state(run)
    resume = resume_path(cfg, run, record)
    try:
        resume_step = check_resumable(resume, lit, datamodule) if resume is not None else 0
    except CheckpointUnreadable as e:
        if cfg.resume != "auto":
            raise
        raise CheckpointUnreadable(
            f"{e}. Delete it to resume from the newest other checkpoint in {resume.parent} "
            f"(or to start the run over if there is none), or pass resume=PATH"
        ) from e
    if resume_step > cfg.trainer.max_steps:
        raise ConfigError(
            f"trainer.max_steps={cfg.trainer.max_steps} is below the step of {resume} ({resume_step}): "
            f"a run is extended, never shortened; set trainer.max_steps >= {resume_step}"
        )

    trainer = build_trainer(cfg, run_dir)
    if isinstance(trainer.checkpoint_callback, Checkpointing):
        trainer.checkpoint_callback.stop_signals = stop_signals()
    check_precision(trainer.precision, trainer.strategy.root_device.type, cfg.get("bf16_check", "warn"))
    with run.lock() if trainer.is_global_zero else contextlib.nullcontext():
        before: set[str] | None = None  # a new run's folder before this command wrote into it
        if trainer.is_global_zero:
            record = run.check(identity, _own_log())  # again under the lock: another process may have run
            if checkpoint_state(run) != seen:
                raise RunDirError(
                    f"run_dir {run_dir} changed while this run was starting (another process saved "
                    f"a checkpoint); run the command again to continue from it"
                )
            for folder in (run.path, run.checkpoints):  # what a killed process was writing: never complete
                remove_partial(folder)
            before = set(os.listdir(run.path)) if record is None else None
        exit_code = 1
        try:
            if trainer.is_global_zero:
                run.write_record(identity, record)
                tracking.keep_run_id(trainer.loggers, run)
                _write_run_start(cfg, composed, run)
                _keep_old_log(run, resume_step)
                log.info(
                    "run dir %s; %s; %.2fM parameters%s",
                    run_dir,
                    lit.model.cfg.posenc,
                    lit.model.num_params() / 1e6,
                    f"; resuming from {resume}" if resume else "",
                )
            results = _fit_and_evaluate(cfg, trainer, lit, datamodule, run, resume)
            exit_code = 0
            return results
        except Exception as e:  # a collective that lost a process: one line, not the backend's traceback
            if trainer.world_size > 1 and (lost := lost_process(e, trainer, run.newest_checkpoint())):
                raise lost from e
            raise
        finally:
            tracking.finish(trainer.loggers, exit_code)
            if exit_code and before is not None and trainer.global_step <= resume_step:
                # a new run that failed before its first step (memory, say): what it wrote would make a corrected
                # rerun into this folder "another run"; nothing of it is worth keeping
                run.remove_new(before, _own_log())


def _fit_and_evaluate(
    cfg: DictConfig, trainer: L.Trainer, lit: LitLM, datamodule: SegmentDataModule, run: RunDir, resume: Path | None
) -> dict[str, Any]:
    _prepare_ddp_relaunch(run.path)
    env_before = {k for k in _DDP_ENV if k in os.environ}
    with torch.serialization.safe_globals(CHECKPOINT_SAFE_GLOBALS):  # checkpoints carry data only
        trainer.fit(lit, datamodule=datamodule, ckpt_path=str(resume) if resume else None, weights_only=True)

    # last.ckpt must hold the final state even when max_steps is not a multiple of checkpoint_every.
    last = run.last_checkpoint
    saved_step = getattr(trainer.checkpoint_callback, "_last_global_step_saved", None)
    if trainer.checkpoint_callback is not None and saved_step != trainer.global_step:
        trainer.save_checkpoint(last)

    results = Results(
        scheme=lit.model.cfg.posenc,
        posenc=OmegaConf.to_container(cfg.posenc, resolve=True),
        data=cfg.data.name,
        unit=datamodule.unit,
        metric=lit.metric,
        seed=int(cfg.seed),
        steps=trainer.global_step,
        tokens=lit.train_tokens,
        wall_time_s=lit.wall_time_s(),
        params=lit.model.num_params(),
        segment_len=cfg.data.segment_len,
        batch_size=cfg.data.batch_size,
        episode_len=cfg.data.episode_len,
        mem_len=lit.model.cfg.mem_len,
        n_layer=lit.model.cfg.n_layer,
        d_model=lit.model.cfg.d_model,
        n_head=lit.model.cfg.n_head,
        world_size=trainer.world_size,
        run_dir=str(run.path),
        checkpoint=str(last) if last.exists() else None,
        resumed_from=str(resume) if resume else None,
        schedule=lit.schedule_stretches(),
    )
    if cfg.final_eval.enabled:
        trainer.limit_val_batches = trainer.limit_test_batches = cfg.final_eval.limit_batches
        trainer.validate(lit, datamodule=datamodule, verbose=False)
        trainer.test(lit, datamodule=datamodule, verbose=False)
        results.val, results.test = lit.eval_results.get("val"), lit.eval_results.get("test")
    if isinstance(trainer.checkpoint_callback, Checkpointing) and last.exists():
        results.health = trainer.checkpoint_callback.final_health(trainer, lit, (results.val or {}).get("loss"))
        if trainer.is_global_zero and not results.health["ok"]:
            log.warning(_unhealthy(results.health))
    if in_multirun() and trainer.world_size > 1:
        _end_local_ddp(env_before)
    if trainer.is_global_zero:
        run.write_results(results)
        summary = {k: v for k, v in (("val", results.val), ("test", results.test)) if v}
        log.info("results (%s): %s", run.results_file, json.dumps(summary))
    return asdict(results)


def _unhealthy(health: dict[str, Any]) -> str:
    """One line: the final checkpoint is not healthy (``Checkpointing.final_health``), and the good one kept. Exit 0
    all the same: its figures are true of its final weights, so a sweep ranks it and an ablation reaches its report."""
    weights, good, limit = health["weights"] or {}, health["good"], health["loss_limit"]
    names = (("val", "val_loss"), ("last training step's", "train_loss"))
    values = [health[k] for _, k in names if health[k] is not None]
    losses, why = " and ".join(f"{n} loss {health[k]:.5g}" for n, k in names if health[k] is not None), []
    if values and not all(map(math.isfinite, values)):
        why.append(f"its {losses} nats are not all finite")
    elif values and not any(x <= limit for x in values):
        why.append(f"its {losses} nats exceed {limit:.4g}, {SANE_LOSS_RATIO:g} x a uniform guess's")
    if not weights.get("ok", True):
        why.append(f"its largest |weight| is {weights['max_abs_weight']:.3g}, |memory| {weights['max_abs_memory']:.3g}")
    kept = "no healthy checkpoint was kept (a lower checkpoint_every keeps more); train again with a lower optim.lr"
    if good:
        after = f" (step {good['step']}, loss {good['loss']:.5g} nats on the step after it)" if "step" in good else ""
        kept = f"good.ckpt{after} is healthy; continue: resume={good['checkpoint']} run_dir=NEW_DIR optim.lr=LOWER"
    return (
        f"the final checkpoint {health['checkpoint']} (step {health['step']}) is not healthy by the rule of a good "
        f"checkpoint (posenc_lab/checkpoints.py): {'; '.join(why)}; {kept}"
    )


def _given(argv: list[str], key: str = "run_dir") -> str | None:
    """The value of the command line's ``key=`` argument, if any."""
    given = [a.split("=", 1)[1] for a in argv[1:] if a.startswith(f"{key}=")]
    return given[-1] if given else None


def _named_run_dir_existed(argv: list[str]) -> bool | None:
    """Whether the folder of a ``run_dir=`` argument existed before this command (None: none given)."""
    given = _given(argv)
    return None if given is None else os.path.lexists(given)


_RUN_DIR_EXISTED: bool | None = None  # set by main(), before Hydra creates the run directory


def _drop_if_never_started(cfg: DictConfig) -> None:
    """After a refused start: remove the run directory Hydra created for this command, if it holds
    nothing but this command's log (so a refused new run_dir leaves nothing behind)."""
    if _RUN_DIR_EXISTED or in_multirun():
        return
    run_dir, own = named_run_dir(cfg), _own_log()
    if not run_dir.is_dir() or any(p.name not in own for p in run_dir.iterdir()):
        return
    for p in run_dir.iterdir():
        p.unlink()
    run_dir.rmdir()


# ---- stop signals ------------------------------------------------------------------------------


def _interrupted(e: Interrupted, cfg: DictConfig) -> Interrupted:
    """The stop, with what was kept and how to continue (one line)."""
    run = RunDir(named_run_dir(cfg))
    if e.quiet or rank_zero_only.rank != 0:
        return Interrupted(e.signum, str(e), quiet=True)
    kept = "" if e.saved else f"; newest checkpoint: {run.newest_checkpoint() or 'none yet'}"
    if e.signum == submitit_signal():
        return Interrupted(e.signum, f"{e}{kept}; submitit requeues the job, which continues from there")
    if e.signum == signal.SIGUSR1 and in_slurm_job():
        return Interrupted(e.signum, f"{e}{kept}; {requeue()}")
    overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    command = shlex.join(["posenc-lab", "train", *[o for o in overrides if not o.startswith("run_dir=")]])
    return Interrupted(e.signum, f"{e}{kept}. Continue with: {command} run_dir={shlex.quote(str(run.path))}")


# Hydra's run and sweep folders are named after these (conf/train.yaml), before the config is checked
_NAME_FOLDERS = ("posenc.name", "data.name")


def _folder_name_problem(argv: list[str]) -> str | None:
    """A scheme or corpus name on the command line that would make Hydra create a folder elsewhere ('/', '..')."""
    for key in _NAME_FOLDERS:
        value = _given(argv, key)
        if value is not None and ("/" in value or os.sep in value or value in (".", "..")):
            group = key.split(".")[0]
            return f"{key}={value!r} is no {group} name (run directories are named after it): use {group}=NAME"
    return None


def main() -> None:
    """``posenc-lab train``: a ``run_dir=`` (or ``hydra.run.dir=``, ``hydra.sweep.dir=``) that cannot be a folder
    is refused before Hydra tries to create it (its error would be a traceback); the overrides are checked before
    Hydra composes them, and in a multirun (``-m``) every job's config before the first job starts."""
    global _RUN_DIR_EXISTED
    keys = ("run_dir", "hydra.run.dir", "hydra.sweep.dir")
    unusable = [path_problem(given, key) for key in keys if (given := _given(sys.argv, key))]
    with reported("train"):
        if any(unusable):
            raise RunDirError(next(p for p in unusable if p))
        if problem := _folder_name_problem(sys.argv):
            raise ConfigError(problem)
        args = sys.argv[1:]
        if problem := grammar_problem("train", args, "train"):  # Hydra's own: a 5-line parser error
            raise OverrideError(problem)
        flags = [a for a in args if a.startswith("-")]
        if flags and set(flags) <= set(MULTIRUN_FLAGS):
            _check_jobs([a for a in args if a not in MULTIRUN_FLAGS])
        elif problem := override_problem("train", args, "train"):
            raise ConfigError(problem)
    _RUN_DIR_EXISTED = _named_run_dir_existed(sys.argv)
    _hydra_main()


def _check_jobs(overrides: list[str]) -> None:
    """ConfigError naming every invalid job of a multirun (compose.job_problems), before the first one starts."""
    found = job_problems("train", overrides, "train", lambda cfg: problems(cfg, "train"))
    if found and len(found) == 1:
        raise ConfigError(f"{found[0]}; no job was started")
    if found:
        listed = "\n".join(f"  - {p}" for p in found)
        raise ConfigError(f"{len(found)} problems in the jobs of the sweep, no job was started:\n{listed}")


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
def _hydra_main(cfg: DictConfig) -> None:
    submitit = submitit_signal()
    requeue_by_submitit = signal.getsignal(submitit) if submitit else None  # before stop_at_once replaces it
    with reported("train", lambda: train_advice(cfg, named_run_dir(cfg))), stop_at_once(stop_signals()):
        try:
            train(cfg)
        except Exception as e:
            _drop_if_never_started(cfg)
            if not isinstance(e, Interrupted):
                raise
            for s in stop_signals():  # on the way out (a requeue makes SLURM send SIGTERM): not stopped again
                signal.signal(s, signal.SIG_IGN)
            stop = _interrupted(e, cfg)
            if e.signum == submitit and callable(requeue_by_submitit):  # saved at the end of the step: now its turn
                if not stop.quiet:
                    print(f"posenc-lab train: {stop}", file=sys.stderr, flush=True)
                requeue_by_submitit(e.signum, None)  # on rank 0: pickles the job, requeues it and exits
            raise stop from None


if __name__ == "__main__":
    keep_freed_memory()  # also when run as python -m, and in DDP ranks
    flush_denormals()
    main()
