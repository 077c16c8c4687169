"""What a run is called in wandb, and which wandb run it continues: the one owner of wandb's names.

- ``run_name``: the run's cell (``cellnames``, with its corpus: ``pystdlib/xl:mem16:half``) and seed, then the sweep
  and trial where there is one: ``pystdlib/xl:mem16:half seed1``, ``recall/xl:mem32 seed0 ablation-recall/k3x9a1b2``;
- ``run_group``: the cell, so that wandb puts the seeds of a cell together (``pystdlib/xl:mem16:half``); in a sweep
  ``sweep-<id>/<cell>`` (the report of a sweep uploads into group ``sweep-<id>``: analysis/wandb_upload.py);
- the wandb run id belongs to the run directory (``RunDir.wandb_id_file``, written when the run first starts): a
  run resumed after SIGTERM or kill -9, or extended, continues its one wandb run (Lightning's WandbLogger inits with
  ``resume="allow"``). A sweep trial's id is the one wandb's agent (or ``posenc-lab sweep``) gives it, WANDB_RUN_ID;
- ``summary_key``: a run's final figure in an uploaded report's summary, ``runs/<cell>/seed<S>/<figure>``.

What the logger's config sets (``logger.name``, ``logger.group``, ``logger.id``; a sweep file's ``logger.group=``)
or wandb's own variables (WANDB_NAME, WANDB_RUN_GROUP) say wins over these defaults.
"""

from __future__ import annotations

import os
import secrets
import string
from typing import Any

from omegaconf import DictConfig, OmegaConf

from .cellnames import WINDOW_KEY, CellName, scheme_label
from .rundir import RunDir

WANDB_LOGGER = "WandbLogger"
_ID_CHARS = string.ascii_lowercase + string.digits


def is_wandb(logger_cfg: Any) -> bool:
    """Whether a logger config (``cfg.logger``) builds Lightning's WandbLogger."""
    if not isinstance(logger_cfg, DictConfig):  # logger=none
        return False
    return str(OmegaConf.select(logger_cfg, "_target_", default="") or "").endswith(WANDB_LOGGER)


def cell(cfg: DictConfig) -> CellName:
    """The run's cell, its corpus in front (wandb holds the runs of every corpus in one project)."""
    return CellName(
        scheme_label(
            str(cfg.posenc.name),
            OmegaConf.select(cfg, "model.random_positions", default=None),
            OmegaConf.to_container(cfg.posenc, resolve=True),
            OmegaConf.to_container(cfg.model, resolve=True),
        ),
        int(cfg.model.mem_len),
        float(OmegaConf.select(cfg, "model.loss_recent_frac", default=1.0)),
        str(cfg.data.name),
        int(cfg.data.segment_len) if OmegaConf.select(cfg, WINDOW_KEY, default=False) and not cfg.model.mem_len else 0,
    )


def sweep(cfg: DictConfig) -> tuple[str, str] | None:
    """(the sweep's name, the trial's id) in a sweep trial (WANDB_SWEEP_ID set, by wandb's agent or ``posenc-lab
    sweep``), else None. The name is the sweep file's (``posenc-lab sweep`` hands it to the SweepTrial callback),
    else ``sweep-<id>``."""
    sweep_id = os.environ.get("WANDB_SWEEP_ID")
    if not sweep_id:
        return None
    name = OmegaConf.select(cfg, "callbacks.sweep_trial.sweep", default=None) or f"sweep-{sweep_id}"
    return str(name), os.environ.get("WANDB_RUN_ID") or "?"


def run_name(cfg: DictConfig) -> str:
    trial = sweep(cfg)
    return f"{cell(cfg)} seed{int(cfg.seed)}" + (f" {trial[0]}/{trial[1]}" if trial else "")


def run_group(cfg: DictConfig) -> str:
    return (f"sweep-{os.environ['WANDB_SWEEP_ID']}/" if sweep(cfg) else "") + str(cell(cfg))


def summary_key(cell_name: str, seed: int | None, figure: str) -> str:
    """The key of one run's figure in a report's wandb summary: the cell and seed keep every run's own."""
    return f"runs/{cell_name}/seed{'?' if seed is None else int(seed)}/{figure}"


def run_id(run: RunDir) -> str:
    """The wandb run id of this run directory: the one it recorded, else WANDB_RUN_ID (a sweep trial), else new."""
    return run.wandb_id() or os.environ.get("WANDB_RUN_ID") or "".join(secrets.choice(_ID_CHARS) for _ in range(8))


def logger_options(cfg: DictConfig, run: RunDir) -> dict[str, Any]:
    """What ``build_trainer`` adds to the WandbLogger of ``cfg.logger``: name, group and id where neither the
    config nor wandb's variables set them."""
    given = cfg.logger
    out: dict[str, Any] = {}
    if given.get("name") is None and not os.environ.get("WANDB_NAME"):
        out["name"] = run_name(cfg)
    if given.get("group") is None and not os.environ.get("WANDB_RUN_GROUP"):
        out["group"] = run_group(cfg)
    if given.get("id") is None and given.get("version") is None:
        out["id"] = run_id(run)
    return out


def keep_run_id(loggers: list, run: RunDir) -> None:
    """Record the wandb run id in the run directory when the run first starts (train.py, under the run's lock)."""
    for logger in loggers:
        if type(logger).__name__ == WANDB_LOGGER and run.wandb_id() is None:
            run.write_wandb_id(str(logger.version))


def finish(loggers: list, exit_code: int) -> None:
    """End the wandb run of these loggers, if one started: Lightning's WandbLogger leaves it open, and the next
    WandbLogger of this process (a Hydra multirun's next job) would log into it instead of its own run."""
    for logger in loggers:
        if type(logger).__name__ == WANDB_LOGGER and getattr(logger, "_experiment", None) is not None:
            logger.experiment.finish(exit_code=exit_code)
