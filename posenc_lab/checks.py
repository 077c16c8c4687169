"""Every training config value is checked before anything is built or written, and a bad one is
named by its key: ``optim.lr must be a number > 0, got -1.0``.

The model's and the schemes' own options are checked where they live (``ModelConfig``, the
scheme classes); this module checks the types and ranges of everything else, and of the model
keys every model has.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, OmegaConf

from .errors import ConfigError
from .precision import POLICIES as BF16_POLICIES

_MISSING = object()


def _int(lo: int | None = None, allow_none: bool = False) -> Callable[[Any], str | None]:
    """Checker: an integer (not a bool) >= lo; returns what is expected, or None if ``v`` is fine."""
    expected = "an integer" + (f" >= {lo}" if lo is not None else "") + (" or null" if allow_none else "")

    def check(v):
        if v is None and allow_none:
            return None
        ok = isinstance(v, int) and not isinstance(v, bool) and (lo is None or v >= lo)
        return None if ok else expected

    return check


def _num(
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
    allow_none: bool = False,
) -> Callable[[Any], str | None]:
    """Checker: a finite number in [lo, hi] (or open ends)."""
    parts = ([f"{'>' if lo_open else '>='} {lo}"] if lo is not None else []) + (
        [f"{'<' if hi_open else '<='} {hi}"] if hi is not None else []
    )
    expected = "a number" + (" " + " and ".join(parts) if parts else "") + (" or null" if allow_none else "")

    def check(v):
        if v is None and allow_none:
            return None
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            return expected
        if lo is not None and (v <= lo if lo_open else v < lo) or hi is not None and (v >= hi if hi_open else v > hi):
            return expected
        return None

    return check


def _bool(v) -> str | None:
    return None if isinstance(v, bool) else "true or false"


def _fraction_or_count(v) -> str | None:
    """Lightning's limit_*_batches / val_check_interval: a fraction in (0, 1] or a count >= 1."""
    if isinstance(v, bool):
        return "a fraction in (0, 1] or a count >= 1"
    if isinstance(v, int) and v >= 1 or isinstance(v, float) and 0 < v <= 1:
        return None
    return "a fraction in (0, 1] or a count >= 1"


def _betas(v) -> str | None:
    ok = isinstance(v, (list, tuple)) and len(v) == 2 and all(_num(0, 1, hi_open=True)(b) is None for b in v)
    return None if ok else "two numbers in [0, 1), e.g. [0.9, 0.95]"


def _buckets(v) -> str | None:
    ok = isinstance(v, (list, tuple)) and len(v) > 0 and all(_int(0)(e) is None for e in v)
    return None if ok else "a non-empty list of integers >= 0 (lower edges of the distance buckets)"


# key -> checker; a key absent from the config is skipped (other options of a group may lack it).
CHECKS: dict[str, Callable[[Any], str | None]] = {
    "seed": _int(),
    "compile": _bool,
    "bf16_check": lambda v: None if v in BF16_POLICIES else f"one of {', '.join(BF16_POLICIES)}",
    "checkpoint_every": _int(1),
    "optim.lr": _num(0, lo_open=True),
    "optim.weight_decay": _num(0),
    "optim.warmup_steps": _int(0),
    "optim.min_lr_ratio": _num(0, 1),
    "optim.betas": _betas,
    "optim.eps": _num(0, lo_open=True),
    "optim.total_steps": _int(1, allow_none=True),
    "data.segment_len": _int(1),
    "data.batch_size": _int(1),
    "data.eval_batch_size": _int(1, allow_none=True),
    "data.episode_len": _int(1, allow_none=True),
    "data.var_len": _bool,
    "data.var_len_std": _num(0, lo_open=True),
    "data.num_workers": _int(0),
    "model.n_layer": _int(1),
    "model.d_model": _int(1),
    "model.n_head": _int(1),
    "model.d_inner": _int(1),
    "model.mem_len": _int(0),
    "model.dropout": _num(0, 1, hi_open=True),
    "model.attn_dropout": _num(0, 1, hi_open=True),
    "model.same_length": _bool,
    "model.pre_norm": _bool,
    "model.tie_weights": _bool,
    "model.loss_recent_frac": _num(0, 1, lo_open=True),
    "trainer.max_steps": _int(1),
    "trainer.accumulate_grad_batches": _int(1),
    "trainer.gradient_clip_val": _num(0, allow_none=True),
    "trainer.val_check_interval": _fraction_or_count,
    "trainer.limit_val_batches": _fraction_or_count,
    "final_eval.enabled": _bool,
    "final_eval.limit_batches": _fraction_or_count,
    "metrics.distance_buckets": _buckets,
}


def _check(cfg: DictConfig, checks: dict[str, Callable[[Any], str | None]]) -> None:
    for key, check in checks.items():
        value = OmegaConf.select(cfg, key, default=_MISSING, throw_on_missing=False)
        if value is _MISSING:
            continue
        if OmegaConf.is_config(value):
            value = OmegaConf.to_container(value, resolve=True)
        expected = check(value)
        if expected is not None:
            if key == "trainer.max_steps":
                expected += " (training is step-based: the train stream is infinite)"
            if key == "max_batches":
                expected += " (the first N segments of every stream; null: all)"
            raise ConfigError(f"{key} must be {expected}, got {value!r}")


def check_train_config(cfg: DictConfig) -> None:
    """Raise ConfigError naming the first bad key (with what would be valid)."""
    _check(cfg, CHECKS)
    resume = OmegaConf.select(cfg, "resume", default=None)
    if resume is not None and not isinstance(resume, (str, bool)) or resume is True:
        raise ConfigError(f"resume must be auto, null or a checkpoint path, got {resume!r}")


EVAL_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "max_batches": _int(1, allow_none=True),
    "data.segment_len": _int(1, allow_none=True),
    "data.batch_size": _int(1, allow_none=True),
    "data.episode_len": _int(1, allow_none=True),
    "model.mem_len": _int(0, allow_none=True),
    "model.same_length": lambda v: None if v is None or isinstance(v, bool) else "true, false or null",
    "dump_losses": _bool,
    "progress_bar": _bool,
}


def check_eval_config(cfg: DictConfig) -> None:
    """``posenc-lab eval``'s keys (conf/eval.yaml); ConfigError naming the first bad one."""
    _check(cfg, EVAL_CHECKS)
    if cfg.split not in ("val", "test"):
        raise ConfigError(f"split must be val or test, got {cfg.split!r}")
