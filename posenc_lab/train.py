"""Training entry point (Hydra): ``python -m posenc_lab.train posenc=xl data=recall trainer.max_steps=200``.

``posenc-lab train ...`` runs the same thing. The run directory (Hydra's, or ``run_dir=...``) gets:

    .hydra/            Hydra's composed config, overrides
    config.yaml        the resolved config of this run
    metrics.csv        metric log (logger=csv; hparams.yaml next to it)
    checkpoints/       last.ckpt (+ periodic ones with callbacks.checkpoint.save_top_k=-1)
    results.json       final validation and test figures (see ``train``)

Rerunning with the same run directory resumes from its last.ckpt (``resume=auto``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import warnings

import hydra
import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from .datamodule import SegmentDataModule
from .lit import CheckpointError, LitLM, read_checkpoint
from .positional import sized_options

log = logging.getLogger("posenc_lab.train")
# The run directory already holds config.yaml and .hydra/ when the CSV log starts: not a problem.
warnings.filterwarnings("ignore", message="Experiment logs directory .* exists and is not empty")
CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")


# ---- building blocks (also used by evaluate.py and the tests) -----------------------------------

def model_config(cfg: DictConfig, vocab_size: int) -> dict[str, Any]:
    """ModelConfig fields from the ``model`` and ``posenc`` nodes (the scheme's options are
    everything in ``posenc`` but its name; options left null are sized to the run's lengths by the scheme)."""
    posenc = OmegaConf.to_container(cfg.posenc, resolve=True)
    model = OmegaConf.to_container(cfg.model, resolve=True)
    name = posenc.pop("name")
    posenc = sized_options(name, posenc, segment_len=cfg.data.segment_len, mem_len=model.get("mem_len", 0),
                           max_offset=OmegaConf.select(cfg, "data.episode_len", default=None) or 0)
    return {**model, "vocab_size": vocab_size, "posenc": name, "posenc_kwargs": posenc}


def build_datamodule(data_cfg: DictConfig | dict) -> SegmentDataModule:
    data = OmegaConf.to_container(data_cfg, resolve=True) if isinstance(data_cfg, DictConfig) else dict(data_cfg)
    return SegmentDataModule(**data)


def build_lit(cfg: DictConfig, datamodule: SegmentDataModule) -> LitLM:
    return LitLM(model=model_config(cfg, datamodule.vocab_size), optim=OmegaConf.to_container(cfg.optim, resolve=True),
                 unit=datamodule.unit, seed=int(cfg.seed), distance_buckets=list(cfg.metrics.distance_buckets),
                 config=OmegaConf.to_container(cfg, resolve=True))


def check_resumable(path: str | os.PathLike, lit: LitLM, datamodule: SegmentDataModule) -> None:
    """Raise CheckpointError if the checkpoint at ``path`` cannot continue this run."""
    ckpt = read_checkpoint(path)
    saved, now = dict(ckpt["hyper_parameters"]["model"]), lit.hparams.model
    # Dropout may change on resume; everything else shapes the parameters or their meaning.
    diff = {k: (saved.get(k), v) for k, v in now.items()
            if k not in ("dropout", "attn_dropout") and saved.get(k) != v}
    if diff:
        listed = ", ".join(f"{k}: checkpoint {a!r}, now {b!r}" for k, (a, b) in diff.items())
        raise CheckpointError(f"checkpoint {path} was trained with another model: {listed}")
    data_state = ckpt.get(type(datamodule).__qualname__, {}).get("train")
    if data_state:
        stream = datamodule.make_stream("train")
        try:
            stream.load_state_dict(data_state)
        except ValueError as e:
            raise CheckpointError(f"checkpoint {path} was trained on other data settings: {e}") from e


def _resume_path(cfg: DictConfig, run_dir: Path) -> Path | None:
    if cfg.resume in (None, False, "none", "never"):
        return None
    if cfg.resume == "auto":
        last = run_dir / "checkpoints" / "last.ckpt"
        return last if last.is_file() else None
    return Path(str(cfg.resume))


_DDP_ENV = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _prepare_ddp_relaunch() -> None:
    """Lightning's DDP launcher re-runs ``sys.argv`` for ranks > 0 with hydra.run.dir set to Hydra's
    run dir. Inside a multirun job that would start the whole sweep again in every rank: hand it this
    job's own overrides and output directory instead."""
    from hydra.core.hydra_config import HydraConfig

    if _in_multirun():
        hc = HydraConfig.get()
        sys.argv = [sys.argv[0], *hc.overrides.task]
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
    # run_dir unset: Hydra's output directory; without Hydra (compose API) a fresh runs/ folder.
    run_dir = OmegaConf.select(cfg, "run_dir", throw_on_missing=False)
    if run_dir is None:
        from hydra.core.hydra_config import HydraConfig

        run_dir = HydraConfig.get().runtime.output_dir if HydraConfig.initialized() else \
            f"runs/{time.strftime('%Y-%m-%d/%H-%M-%S')}_{cfg.posenc.name}_{cfg.data.name}"
    run_dir = Path(run_dir).resolve()
    with open_dict(cfg):
        cfg.run_dir = str(run_dir)
    L.seed_everything(int(cfg.seed), workers=True, verbose=False)

    # Everything that can be checked is checked before the trainer starts (and before DDP launches).
    datamodule = build_datamodule(cfg.data)
    lit = build_lit(cfg, datamodule)
    lit.check_data(datamodule, ("train", "val"))
    resume = _resume_path(cfg, run_dir)
    if resume is not None:
        check_resumable(resume, lit, datamodule)

    logger = hydra.utils.instantiate(cfg.logger) if cfg.get("logger") and "_target_" in cfg.logger else False
    callbacks = [hydra.utils.instantiate(c) for c in (cfg.get("callbacks") or {}).values()
                 if c is not None and "_target_" in c]
    trainer: L.Trainer = hydra.utils.instantiate(cfg.trainer, logger=logger, callbacks=callbacks,
                                                 default_root_dir=str(run_dir))
    if trainer.max_steps is None or trainer.max_steps < 1:
        raise ValueError("set trainer.max_steps: training is step-based (the train stream is infinite)")
    if trainer.is_global_zero:
        run_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
        log.info("run dir %s; %s; %.2fM parameters%s", run_dir, lit.model.cfg.posenc, lit.model.num_params() / 1e6,
                 f"; resuming from {resume}" if resume else "")
        if resume is not None and (run_dir / "metrics.csv").exists():
            # CSVLogger would delete the log of the interrupted part: keep it under another name.
            step = int(read_checkpoint(resume)["global_step"])
            (run_dir / "metrics.csv").rename(run_dir / f"metrics.until_step{step}.csv")
    _prepare_ddp_relaunch()
    env_before = {k for k in _DDP_ENV if k in os.environ}

    start = time.perf_counter()
    trainer.fit(lit, datamodule=datamodule, ckpt_path=str(resume) if resume else None)
    wall = time.perf_counter() - start

    # last.ckpt must hold the final state even when max_steps is not a multiple of checkpoint_every.
    ckpt_dir = run_dir / "checkpoints"
    last = ckpt_dir / "last.ckpt"
    saved_step = getattr(trainer.checkpoint_callback, "_last_global_step_saved", None)
    if trainer.checkpoint_callback is not None and saved_step != trainer.global_step:
        trainer.save_checkpoint(last)

    results: dict[str, Any] = {
        "scheme": lit.model.cfg.posenc, "posenc": OmegaConf.to_container(cfg.posenc, resolve=True),
        "data": cfg.data.name, "unit": datamodule.unit, "metric": lit.metric, "seed": int(cfg.seed),
        "steps": trainer.global_step, "tokens": lit.train_tokens, "wall_time_s": wall,
        "params": lit.model.num_params(), "segment_len": cfg.data.segment_len, "batch_size": cfg.data.batch_size,
        "episode_len": cfg.data.episode_len, "mem_len": lit.model.cfg.mem_len,
        "n_layer": lit.model.cfg.n_layer, "d_model": lit.model.cfg.d_model, "n_head": lit.model.cfg.n_head,
        "world_size": trainer.world_size, "run_dir": str(run_dir),
        "checkpoint": str(last) if last.exists() else None, "resumed_from": str(resume) if resume else None,
    }
    if cfg.final_eval.enabled:
        trainer.limit_val_batches = trainer.limit_test_batches = cfg.final_eval.limit_batches
        trainer.validate(lit, datamodule=datamodule, verbose=False)
        trainer.test(lit, datamodule=datamodule, verbose=False)
        results["val"], results["test"] = lit.eval_results.get("val"), lit.eval_results.get("test")
    if _in_multirun() and trainer.world_size > 1:
        _end_local_ddp(env_before)
    if trainer.is_global_zero:
        (run_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        summary = {k: results[k] for k in ("val", "test") if results.get(k)}
        log.info("results (%s): %s", run_dir / "results.json", json.dumps(summary))
    return results


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
def main(cfg: DictConfig) -> None:
    train(cfg)


if __name__ == "__main__":
    main()
