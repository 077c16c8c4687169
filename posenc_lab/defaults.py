"""Defaults live in ``conf/`` only. The Python API (``LitLM(model=...)`` with no optimizer settings,
``EvalStats()`` with no buckets) reads the ones it needs from ``conf/train.yaml`` here."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from . import config_dir


@functools.cache
def _train_yaml() -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.load(Path(config_dir()) / "train.yaml"), resolve=False)


def optim_defaults() -> dict[str, Any]:
    """conf/train.yaml's ``optim`` node (AdamW and its schedule)."""
    return dict(_train_yaml()["optim"])


def distance_buckets() -> tuple[int, ...]:
    """conf/train.yaml's ``metrics.distance_buckets``: lower edges of the recall-accuracy buckets."""
    return tuple(_train_yaml()["metrics"]["distance_buckets"])
