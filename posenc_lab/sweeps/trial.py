"""The Lightning callback ``posenc-lab sweep`` adds to every trial (through an appended Hydra override,
``+callbacks.sweep_trial._target_=posenc_lab.sweeps.trial.SweepTrial``; train.py is not changed):

- after each validation during training it appends ``{"step", "value"}`` of the sweep's metric to
  ``history`` (JSON lines; the runner feeds them to the engine's early termination while the trial runs);
- then, if the runner has written the file ``stop``, it stops training there: the trial ends as a run that
  reached its last step (train.py saves last.ckpt, evaluates and writes results.json) and appends
  ``{"stopped_at": step}`` to ``history``;
- on SIGTERM (the runner stopping, or SLURM) it saves ``checkpoints/last.ckpt`` of a single-process run, so
  that the rerun continues from that very step.

The offline sweep id is not one wandb's server knows: a run carrying it would not upload (`wandb sync` answers
"sweep not found"). So the callback sets wandb up without WANDB_SWEEP_ID before wandb starts (the run logs to
the sweep file's project instead) and writes the sweep into the wandb run's config and tags.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities.exceptions import SIGTERMException

from ..rundir import RunDir

STOPPED_KEY = "stopped_at"


class SweepTrial(L.Callback):
    """``logger``: the run's logger class (``${oc.select:logger._target_,null}``)."""

    def __init__(self, metric: str, history: str, stop: str, sweep: str | None = None, logger: str | None = None):
        self.metric, self.history, self.stop = metric, Path(history), Path(stop)
        self.sweep = sweep  # the sweep's name, for wandb
        self.sweep_id = os.environ.get("WANDB_SWEEP_ID")
        if self.sweep_id and str(logger).endswith("WandbLogger"):
            # wandb reads its settings from the environment once, at setup; the loggers are built before the
            # callbacks, but wandb.init runs later (at fit). The variable stays for the config (${oc.env:...}).
            import wandb

            del os.environ["WANDB_SWEEP_ID"]
            try:
                wandb.setup()
            finally:
                os.environ["WANDB_SWEEP_ID"] = self.sweep_id

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or not self.sweep_id or not trainer.is_global_zero:
            return
        for logger in trainer.loggers:
            run = getattr(logger, "experiment", None)
            if type(logger).__name__ == "WandbLogger" and hasattr(run, "tags"):
                run.config.update({"sweep": {"id": self.sweep_id, "name": self.sweep}}, allow_val_change=True)
                run.tags = (*run.tags, f"sweep-{self.sweep_id}")

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        value = trainer.callback_metrics.get(self.metric)
        if trainer.is_global_zero and value is not None:
            self._append({"step": int(trainer.global_step), "value": float(value)})
        # every rank decides alike (a rank that stopped alone would hang the others)
        stop = trainer.strategy.reduce_boolean_decision(self.stop.exists(), all=False)
        if stop and not trainer.should_stop:
            trainer.should_stop = True
            if trainer.is_global_zero:
                self._append({STOPPED_KEY: int(trainer.global_step)})

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if isinstance(exception, SIGTERMException) and trainer.world_size == 1 and trainer.state.fn == "fit":
            ckpt = trainer.checkpoint_callback
            if ckpt is not None and getattr(ckpt, "dirpath", None):
                trainer.save_checkpoint(Path(ckpt.dirpath) / RunDir.LAST)

    def _append(self, row: dict[str, Any]) -> None:
        self.history.parent.mkdir(parents=True, exist_ok=True)
        with open(self.history, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()


def read_history(path: str | os.PathLike) -> tuple[list[list[float]], int | None]:
    """([[step, value], ...] by step, the step it was stopped at or None) from a trial's history file. A line
    cut short by a killed process is skipped; a step validated again after a resume keeps its newest value."""
    values: dict[int, float] = {}
    stopped = None
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return [], None
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if STOPPED_KEY in row:
            stopped = int(row[STOPPED_KEY])
        elif "value" in row:
            values[int(row["step"])] = float(row["value"])
    return [[step, values[step]] for step in sorted(values)], stopped
