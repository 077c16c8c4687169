"""What the line of memory running out says after the allocator's words (errors.reported prints it): the sizes a
step's memory grows with, what to lower, and what was kept. Checkpoints are named, never read: memory has just run
out. Lower sizes are another run (they are part of its identity, rundir.py)."""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from .checkpoints import GOOD_CHECKPOINTS
from .errors import PosencLabError
from .rundir import RunDir

TRAIN_SIZES = (
    "data.batch_size",
    "data.segment_len",
    "model.mem_len",
    "model.n_layer",
    "model.d_model",
    "model.n_head",
    "trainer.precision",
)


def train_advice(cfg: DictConfig, run_dir: Path) -> str:
    """``posenc-lab train``: its sizes, what to lower, and the newest checkpoint kept in ``run_dir``."""
    sizes = ", ".join(f"{key}={OmegaConf.select(cfg, key, default=None)}" for key in TRAIN_SIZES)
    lower = (
        "lower data.batch_size, data.segment_len or model.mem_len (or the model: model.n_layer, model.d_model), "
        "or use trainer.precision=bf16-mixed"
    )
    run = RunDir(run_dir)
    newest, good = run.newest_checkpoint(), run.checkpoints / GOOD_CHECKPOINTS[0]
    if newest is None and not run.record_file.exists():  # a new run that failed at its start left nothing
        return f"at {sizes}: {lower}; no checkpoint was saved before it"
    if newest is None:
        return f"at {sizes}; no checkpoint was saved before it: {lower}, with another run_dir"
    also = f" (the newest good one: {good})" if good.is_file() and not os.path.samefile(good, newest) else ""
    return (
        f"at {sizes}; the newest checkpoint is kept: {newest}{also}. With more memory free, the same command "
        f"continues from it; or {lower}, with another run_dir"
    )


def eval_advice(cfg: DictConfig) -> str:
    """``posenc-lab eval``: its sizes (a null one as the run was trained: its config.yaml, not the checkpoint, which
    memory may not hold twice), what to lower, and that nothing changed."""
    try:
        trained = RunDir.of_checkpoint(cfg.ckpt).config()
    except (PosencLabError, OSError):
        trained = {}
    data, model = trained.get("data") or {}, trained.get("model") or {}
    sizes = {
        "data.batch_size": cfg.data.batch_size or data.get("eval_batch_size") or data.get("batch_size"),
        "data.segment_len": cfg.data.segment_len or data.get("segment_len"),
        "model.mem_len": model.get("mem_len") if cfg.model.mem_len is None else cfg.model.mem_len,
        **{f"model.{key}": model.get(key) for key in ("n_layer", "d_model", "n_head")},
        "precision": cfg.precision,
    }
    listed = ", ".join(f"{key}={value}" for key, value in sizes.items())
    return (
        f"at {listed}: lower data.batch_size (the streams evaluated at once), data.segment_len or model.mem_len, or "
        f"use precision=bf16-mixed; {cfg.ckpt} is unchanged and nothing was written"
    )
