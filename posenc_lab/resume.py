"""Resuming a run: which checkpoint ``resume`` names, whether it can continue this run, and the run's folders,
checked before anything is loaded or written (train.py)."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from . import tracking
from .checkpoints import CheckpointError, read_checkpoint
from .datamodule import SegmentDataModule
from .errors import ConfigError
from .io import path_problem
from .lit import LitLM
from .rundir import RunDir, RunDirError


def check_resumable(path: str | os.PathLike, lit: LitLM, datamodule: SegmentDataModule) -> int:
    """The global step of the checkpoint at ``path``; CheckpointError if it cannot continue this run."""
    ckpt = read_checkpoint(path)
    saved, now = dict(ckpt["hyper_parameters"]["model"]), lit.hparams.model
    step = int(ckpt.get("global_step", 0))
    # Dropout may change on resume; everything else shapes the parameters or their meaning.
    diff = {
        k: (saved.get(k), v)
        for k, v in now.items()
        if k not in ("dropout", "attn_dropout", "attention_impl") and saved.get(k) != v
    }  # speed-only: may change
    if "posenc_kwargs" in diff and _same_past(*diff["posenc_kwargs"], step):
        del diff["posenc_kwargs"]
    if diff:
        listed = ", ".join(f"{k}: checkpoint {a!r}, now {b!r}" for k, (a, b) in diff.items())
        raise CheckpointError(f"checkpoint {path} was trained with another model: {listed}")
    saved_shapes = {k: tuple(v.shape) for k, v in ckpt["state_dict"].items() if isinstance(v, torch.Tensor)}
    shapes = {k: tuple(v.shape) for k, v in lit.state_dict().items()}
    misfits = [
        f"{k}: checkpoint {list(saved_shapes[k])}, now {list(v)}"
        if k in saved_shapes
        else f"{k}: not in the checkpoint"
        for k, v in shapes.items()
        if saved_shapes.get(k) != v
    ] + [f"{k}: not in this model" for k in sorted(saved_shapes.keys() - shapes.keys())]
    if misfits:
        listed = "; ".join(misfits[:3]) + (f"; and {len(misfits) - 3} more" if len(misfits) > 3 else "")
        raise CheckpointError(f"checkpoint {path} holds weights of another shape than this model's: {listed}")
    data_state = ckpt.get(type(datamodule).__qualname__, {}).get("train")
    if data_state:
        stream = datamodule.make_stream("train")
        try:
            stream.load_state_dict(data_state)
        except ValueError as e:
            raise CheckpointError(f"checkpoint {path} was trained on other data settings: {e}") from e
    return step


def _same_past(saved: dict | None, now: dict | None, step: int) -> bool:
    """The scheme's options differ in DroPE's step alone, and both steps lie at or after the checkpoint's: every step
    taken so far ran as either would run it, so a finished run continues with a drop (``+posenc.drop_at_step=K``)."""
    saved, now = dict(saved or {}), dict(now or {})
    drops = [saved.pop("drop_at_step", None), now.pop("drop_at_step", None)]
    return saved == now and all(k is None or (isinstance(k, int) and k >= step) for k in drops)


def resume_path(cfg: DictConfig, run: RunDir, record: dict | None) -> Path | None:
    """The checkpoint ``cfg.resume`` names (auto: the run's newest), None to start afresh; RunDirError if
    resume=null would overwrite the checkpoints of this run (``record``: its run.json, None for a new run)."""
    if cfg.resume in (None, False, "none", "never"):
        existing = run.newest_checkpoint() if record is not None else None
        if existing is not None:
            raise RunDirError(
                f"resume=null would start run_dir {run.path} over and overwrite its checkpoints "
                f"({existing}); use resume=auto to continue it, or another run_dir"
            )
        return None
    if cfg.resume == "auto":
        return run.newest_checkpoint()
    return Path(str(cfg.resume))


def check_folders(cfg: DictConfig, run: RunDir) -> None:
    """RunDirError before anything is loaded or written if the run's folders cannot be what they must (its
    checkpoints/ a file, its .lock a folder, a checkpoint folder that cannot be created, a checkpoint file name
    that would leave its folder; CorruptFileError for a damaged wandb run id)."""
    run.check_folders()
    if tracking.is_wandb(cfg.get("logger")):
        run.wandb_id()  # the wandb run a resumed run continues (tracking.py): readable, or named now
    dirpath = OmegaConf.select(cfg, "callbacks.checkpoint.dirpath", default=None)
    if dirpath is not None and Path(dirpath).absolute() != run.checkpoints.absolute():
        if problem := path_problem(dirpath, "callbacks.checkpoint.dirpath"):
            raise RunDirError(problem)
    filename = OmegaConf.select(cfg, "callbacks.checkpoint.filename", default=None)
    if filename is not None and ("/" in str(filename) or os.sep in str(filename) or str(filename) in ("", ".", "..")):
        raise ConfigError(
            f"callbacks.checkpoint.filename={filename!r} would save checkpoints outside callbacks.checkpoint.dirpath: "
            f"a file name holds no '/' (the default: 'step{{step:07d}}')"
        )


def checkpoint_state(run: RunDir) -> tuple[str, int] | None:
    """(path, mtime) of the checkpoint resume=auto would take: changes when another process saves one."""
    newest = run.newest_checkpoint()
    return (str(newest), newest.stat().st_mtime_ns) if newest is not None else None
