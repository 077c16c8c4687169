"""Config -> objects: the model's config, the datamodule, the LightningModule and the trainer, from a
composed Hydra config. The entry points (train, eval, the sweeps, ablate) build through here, so that no
entry point imports another.
"""

from __future__ import annotations

from pathlib import Path

import hydra
import lightning as L
from omegaconf import DictConfig, OmegaConf

from . import tracking
from .checkpoints import AtomicCheckpointIO
from .datamodule import SegmentDataModule
from .errors import ConfigError
from .lit import LitLM
from .model import ModelConfig
from .positional import sized_options
from .rundir import RunDir


def model_config(cfg: DictConfig, vocab_size: int) -> ModelConfig:
    """The model's typed config from the ``model`` and ``posenc`` nodes (the scheme's options are everything in
    ``posenc`` but its name; options left null are sized to the run's lengths by the scheme). ValueError naming
    every invalid field (``ModelConfig.problems``)."""
    posenc = OmegaConf.to_container(cfg.posenc, resolve=True)
    model = OmegaConf.to_container(cfg.model, resolve=True)
    name = posenc.pop("name")
    posenc = sized_options(
        name,
        posenc,
        segment_len=cfg.data.segment_len,
        mem_len=model.get("mem_len", 0),
        max_offset=OmegaConf.select(cfg, "data.episode_len", default=None) or 0,
    )
    return ModelConfig(**model, vocab_size=vocab_size, posenc=name, posenc_kwargs=posenc)


def build_datamodule(data_cfg: DictConfig | dict) -> SegmentDataModule:
    data = OmegaConf.to_container(data_cfg, resolve=True) if isinstance(data_cfg, DictConfig) else dict(data_cfg)
    return SegmentDataModule(**data)


def build_lit(cfg: DictConfig, datamodule: SegmentDataModule) -> LitLM:
    model = model_config(cfg, datamodule.vocab_size)
    check_data_positions(model, datamodule)
    return LitLM(
        model=model,
        optim=OmegaConf.to_container(cfg.optim, resolve=True),
        unit=datamodule.unit,
        seed=int(cfg.seed),
        distance_buckets=list(cfg.metrics.distance_buckets),
        config=OmegaConf.to_container(cfg, resolve=True),
    )


def check_data_positions(model: ModelConfig, datamodule: SegmentDataModule) -> None:
    """Raise ConfigError where ``model.data_positions`` reads ids the corpus does not give, or ids past its table."""
    kind, corpus = model.data_positions, datamodule.corpus
    if kind is None:
        return
    given = corpus.position_id_max
    if kind not in given:
        raise ConfigError(
            f"model.data_positions={kind} reads the data's {kind} position ids, and data.name={datamodule.name} gives "
            f"{', '.join(sorted(given)) or 'none'}: set data.corpus.position_ids=true on a task that has them "
            f"(coupling: addition, addition_reversed; abacus: every task), or model.data_positions=null"
        )
    if given[kind] >= model.data_positions_size:
        raise ConfigError(
            f"model.data_positions_size={model.data_positions_size} is too small for the {kind} ids of data.name="
            f"{datamodule.name}, up to {given[kind]} (the longest test instance, or a training one shifted by "
            f"data.corpus.position_shift): raise it to at least {given[kind] + 1}"
        )


def check_splits(datamodule: SegmentDataModule) -> None:
    """Raise ConfigError naming the split that cannot be cut into the configured streams."""
    _ = datamodule.corpus  # loaded first: a corpus that cannot load says why itself (a file too small, say)
    for split in ("train", "val", "test"):
        try:
            datamodule.make_stream(split)
        except ValueError as e:
            sizes = "data.batch_size" if split == "train" else "data.eval_batch_size (or data.batch_size)"
            raise ConfigError(
                f"the {split} split of data.name={datamodule.name} is too short for these streams: {e}. "
                f"Lower {sizes} or data.segment_len, or use a larger corpus"
            ) from e


def build_trainer(cfg: DictConfig, run_dir: Path) -> L.Trainer:
    """The Lightning Trainer of ``cfg.trainer`` with the configured logger and callbacks, writing into run_dir."""
    logger = False
    if cfg.get("logger") and "_target_" in cfg.logger:  # a wandb run's name, group and id: tracking.py
        extra = tracking.logger_options(cfg, RunDir(run_dir)) if tracking.is_wandb(cfg.logger) else {}
        logger = hydra.utils.instantiate(cfg.logger, **extra)
    callbacks = [
        hydra.utils.instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None and "_target_" in c
    ]
    # every checkpoint is written beside its target and renamed into place, whatever $TMPDIR is (checkpoints.py)
    plugins = [AtomicCheckpointIO(), *hydra.utils.instantiate(cfg.trainer.get("plugins") or [])]
    return hydra.utils.instantiate(
        cfg.trainer, logger=logger, callbacks=callbacks, plugins=plugins, default_root_dir=str(run_dir)
    )
