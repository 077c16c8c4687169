"""Every default is written once, in ``conf/``. Python code that runs without Hydra reads it here: the Python API
(``LitLM(model=...)`` with no optimizer settings, ``EvalStats()`` with no buckets) takes conf/train.yaml's values,
and the benchmark a model option of conf/model/ with its base. The Python keyword defaults that mirror conf/
(``ModelConfig``'s fields, ``SegmentDataModule``'s, every corpus loader's) are compared with conf/ value by value
(tests/test_configs.py): model.py and data/ import no config library."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from . import config_dir

#: the option of conf/model/ and conf/data/ that every other option of the group inherits (``defaults: [default]``)
BASE = "default"


@functools.cache
def _train_yaml() -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.load(Path(config_dir()) / "train.yaml"), resolve=False)


def optim_defaults() -> dict[str, Any]:
    """conf/train.yaml's ``optim`` node (AdamW and its schedule)."""
    return dict(_train_yaml()["optim"])


def distance_buckets() -> tuple[int, ...]:
    """conf/train.yaml's ``metrics.distance_buckets``: lower edges of the recall-accuracy buckets."""
    return tuple(_train_yaml()["metrics"]["distance_buckets"])


def group_options(group: str) -> tuple[str, ...]:
    """The options of ``conf/<group>/``, sorted, the base aside."""
    return tuple(sorted(p.stem for p in (Path(config_dir()) / group).glob("*.yaml") if p.stem != BASE))


def group_option(group: str, name: str) -> dict[str, Any]:
    """``conf/<group>/<name>.yaml`` merged onto what its defaults list names (the base), unresolved: the node
    that ``group=name`` composes (tests/test_configs.py checks it against Hydra's compose)."""
    folder = Path(config_dir()) / group
    node = OmegaConf.load(folder / f"{name}.yaml")
    parents = node.pop("defaults", [])
    merged = OmegaConf.merge(*(group_option(group, str(p)) for p in parents), node) if parents else node
    return OmegaConf.to_container(merged, resolve=False)
