"""The analysis settings: the ``ablate.analysis`` block of conf/ablate.yaml, the one owner of every analysis
default. The code declares each block as a dataclass without default values (its keys, their types and their
ranges), and OmegaConf checks a block against it: a misspelled key, a wrong type or a missing key is one line
naming it. The commands that run one analysis alone (``python -m posenc_lab_analysis.extrapolation``,
``posenc-lab compare``, ...) take their defaults from the same file (``conf_block``).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException

from posenc_lab import config_dir
from posenc_lab.errors import ConfigError

CONF_FILE = Path(config_dir()) / "ablate.yaml"
PREFIX = "ablate.analysis"

T = TypeVar("T")


@functools.cache
def _conf_analysis() -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONF_FILE).ablate.analysis, resolve=True)


def conf_block(*keys: str) -> Any:
    """The value of ``ablate.analysis.<keys>`` as conf/ablate.yaml states it (no preset applied): the defaults of
    the commands that run one analysis alone. A copy: changing it changes nothing else."""
    value: Any = _conf_analysis()
    for k in keys:
        value = value[k]
    return copy.deepcopy(value)


def structured(kind: type[T], values: Mapping | None, where: str = PREFIX) -> T:
    """``values`` checked against the dataclass ``kind`` by OmegaConf and built into one: a ConfigError in one
    line naming the key (``where`` + its path) for an unknown, missing or mistyped value; the dataclass's own
    range checks (``__post_init__``) run last."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(kind), dict(values or {}))
        return OmegaConf.to_object(merged)
    except ConfigKeyError as e:
        parent, _, leaf = f"{where}.{e.full_key}".rpartition(".")
        keys = ", ".join(sorted(f.name for f in dataclasses.fields(e.object_type))) if e.object_type else "?"
        raise ConfigError(f"{parent}.{leaf} is not a key of {parent}; the keys are: {keys}") from None
    except MissingMandatoryValue as e:
        raise ConfigError(
            f"{where}.{e.full_key} is missing; conf/ablate.yaml states every analysis setting (add it there)"
        ) from None
    except OmegaConfBaseException as e:
        key = f"{where}.{e.full_key}" if e.full_key else where
        raise ConfigError(f"{key}: {str(e.msg).splitlines()[0]}") from None
