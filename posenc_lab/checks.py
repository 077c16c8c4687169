"""The one validator: every problem of a composed config, named by its key, before anything is built,
loaded or written (``optim.lr must be a number > 0, got -1.0``).

``problems(cfg, command)`` returns them all; ``check(cfg, command)`` raises one ``ConfigError`` that lists
them. ``train``, ``eval``, the sweep check and ``ablate`` call it. Each fact has its owner: the model's
fields are checked by ``ModelConfig.problems``, a scheme's options and lengths by the scheme, a corpus's
options by the corpus registry, the trainer's precisions by Lightning's signature and its strategies and
accelerators by Lightning's registries, the logger's and every callback's keys by their class's signature; this
module checks the rest (optimizer, data, trainer, run settings) and collects the owners' answers.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import math
import typing
from collections.abc import Callable
from typing import Any

import lightning
from lightning.pytorch import Callback
from lightning.pytorch.accelerators import Accelerator, AcceleratorRegistry
from lightning.pytorch.loggers import Logger
from lightning.pytorch.strategies import Strategy, StrategyRegistry
from omegaconf import DictConfig, ListConfig, OmegaConf

from .build import model_config
from .data import CORPORA, EVAL_SPLITS, check_corpus_options, option_problems
from .data.streams import aligned_problem
from .datamodule import SegmentDataModule
from .errors import ConfigError, shown
from .footprint import train_problem
from .model import ModelConfig
from .positional import SCHEMES, PositionalScheme, build_scheme
from .precision import POLICIES as BF16_POLICIES

COMMANDS = ("train", "eval", "sweep")
_MISSING = object()
SEED_MAX = 2**32 - 1  # numpy's and Lightning's seeds are 32-bit


def _int(lo: int | None = None, allow_none: bool = False, hi: int | None = None) -> Callable[[Any], str | None]:
    """Checker: an integer (not a bool) in [lo, hi]; returns what is expected, or None if ``v`` is fine."""
    expected = "an integer" + (f" >= {lo}" if lo is not None else "") + (f" and <= {hi}" if hi is not None else "")
    expected += " or null" if allow_none else ""

    def check(v):
        if v is None and allow_none:
            return None
        ok = isinstance(v, int) and not isinstance(v, bool) and (lo is None or v >= lo) and (hi is None or v <= hi)
        return None if ok else expected

    return check


def _num(lo: float | None = None, hi: float | None = None, lo_open=False, hi_open=False, allow_none=False):
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
    if not isinstance(v, bool) and (isinstance(v, int) and v >= 1 or isinstance(v, float) and 0 < v <= 1):
        return None
    return "a fraction in (0, 1] or a count >= 1"


def _betas(v) -> str | None:
    ok = isinstance(v, (list, tuple)) and len(v) == 2 and all(_num(0, 1, hi_open=True)(b) is None for b in v)
    return None if ok else "two numbers in [0, 1), e.g. [0.9, 0.95]"


def _buckets(v) -> str | None:
    ok = isinstance(v, (list, tuple)) and len(v) > 0 and all(_int(0)(e) is None for e in v)
    return None if ok else "a non-empty list of integers >= 0 (lower edges of the distance buckets)"


def _one_of(*valid) -> Callable[[Any], str | None]:
    return lambda v: None if v in valid else f"one of {', '.join(map(str, valid))}"


# key -> checker, for the keys of conf/train.yaml that no other module owns; a key absent from the config
# is skipped (other options of a group may lack it).
TRAIN_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "seed": _int(0, hi=SEED_MAX),
    "compile": _bool,
    "bf16_check": _one_of(*BF16_POLICIES),
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
    "data.num_workers": _int(0, allow_none=True),
    "trainer.max_steps": _int(1),
    "trainer.accumulate_grad_batches": _int(1),
    "trainer.gradient_clip_val": _num(0, allow_none=True),
    "trainer.val_check_interval": _fraction_or_count,
    "trainer.limit_val_batches": _fraction_or_count,
    "trainer.num_nodes": _int(1),
    "final_eval.enabled": _bool,
    "final_eval.limit_batches": _fraction_or_count,
    "metrics.distance_buckets": _buckets,
}
EVAL_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "compile": _bool,
    "split": _one_of(*EVAL_SPLITS),
    "max_batches": _int(1, allow_none=True),
    "data.segment_len": _int(1, allow_none=True),
    "data.batch_size": _int(1, allow_none=True),
    "data.episode_len": _int(1, allow_none=True),
    "model.mem_len": _int(0, allow_none=True),
    "model.same_length": lambda v: None if v is None or isinstance(v, bool) else "true, false or null",
    "dump_losses": _bool,
    "progress_bar": _bool,
    "allow_other_corpus": _bool,
}
# what a key's message adds to "must be ..."
_HINTS = {
    "trainer.max_steps": " (training is step-based: the train stream is infinite)",
    "max_batches": " (the first N segments of every stream; null: all)",
    "seed": " (numpy and Lightning take 32-bit seeds)",
}


def _value(cfg: DictConfig, key: str):
    try:
        value = OmegaConf.select(cfg, key, default=_MISSING, throw_on_missing=False)
    except Exception as e:  # noqa: BLE001 - an interpolation that cannot resolve is a problem to name, not a crash
        return e
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def _table_problems(cfg: DictConfig, checks: dict[str, Callable[[Any], str | None]]) -> list[str]:
    out = []
    for key, check in checks.items():
        value = _value(cfg, key)
        if value is _MISSING:
            continue
        if isinstance(value, Exception):
            out.append(f"{key} cannot be resolved: {value}")
            continue
        expected = check(value)
        if expected is not None:
            out.append(f"{key} must be {expected}{_HINTS.get(key, '')}, got {shown(value)}")
    return out


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def lightning_precisions() -> list:
    """The values Lightning's ``Trainer(precision=...)`` accepts, read from its signature."""

    def leaves(t) -> list:
        if typing.get_origin(t) is typing.Literal:
            return list(typing.get_args(t))
        return [v for a in typing.get_args(t) for v in leaves(a)]

    return leaves(typing.get_type_hints(lightning.Trainer.__init__)["precision"])


def _model_problems(cfg: DictConfig) -> list[str]:
    """The model node (ModelConfig owns its fields) and the scheme (it owns its options and lengths)."""
    model = _value(cfg, "model")
    if not isinstance(model, dict):
        return [f"model must be a mapping of model options, got {shown(model)}"]
    fields = {f.name for f in dataclasses.fields(ModelConfig)} - {"vocab_size", "posenc", "posenc_kwargs"}
    unknown = sorted(set(model) - fields)
    if unknown:
        return [f"model.{k} is not a model option; the options are: {', '.join(sorted(fields))}" for k in unknown]
    data = _value(cfg, "data") or {}
    if not _is_int(data.get("segment_len")):
        return []  # named by the data checks; the scheme's lengths cannot be judged without it
    try:
        # the vocabulary is the corpus's (not loaded here): any size leaves room for the adaptive cutoffs
        cutoffs = model.get("adaptive_cutoffs") or [255]
        vocab = max(256, int(cutoffs[-1]) + 1) if _is_int(cutoffs[-1]) else 256
        mc = model_config(cfg, vocab)
    except (TypeError, ValueError) as e:
        return [p if p.startswith("model.") else f"model/posenc: {p}" for p in str(e).split("; ")]
    if problem := train_problem(cfg, mc):  # before the scheme is built: a size that cannot fit builds nothing
        return [problem]
    try:
        scheme = build_scheme(mc.posenc, mc.dims, **mc.posenc_kwargs)
        episode = data.get("episode_len")
        mc.check_lengths(scheme, int(data["segment_len"]), mc.mem_len, int(episode) if _is_int(episode) else 0)
    except (TypeError, ValueError) as e:  # a line about a model option (random positions) is named by it alone
        return [str(e) if str(e).startswith(("model.", "with model.")) else f"posenc: {e}"]
    problem = compile_problem(mc.posenc, scheme)
    return [problem] if _value(cfg, "compile") is True and problem else []


def compile_problem(scheme: str, built: PositionalScheme | None = None) -> str | None:
    """Why ``compile=true`` cannot serve ``scheme`` (its ``compile_refused``; that of ``built``, the scheme as built,
    where given: a hybrid's is its layers'), as one line; None if it can."""
    why = built.compile_refused if built is not None else SCHEMES[scheme].compile_refused if scheme in SCHEMES else None
    return f"compile=true cannot serve posenc={scheme}: {why} (set compile=false)" if why else None


def _data_problems(cfg: DictConfig) -> list[str]:
    out = []
    data = _value(cfg, "data")
    if not isinstance(data, dict):
        return [f"data must be a mapping of data options, got {shown(data)}"]
    name = data.get("name")
    if name not in CORPORA:
        out.append(f"data.name={shown(name)} is not a corpus; valid: {', '.join(sorted(CORPORA))}")
    else:
        options = data.get("corpus") or {}
        try:
            if not isinstance(options, dict):
                raise ValueError(f"data.corpus must be a mapping of corpus {name}'s options, got {options!r}")
            check_corpus_options(name, options)
            out += option_problems(name, options)
        except ValueError as e:
            out.append(str(e))
    valid = set(inspect.signature(SegmentDataModule.__init__).parameters) - {"self"}
    out += [
        f"data.{k} is not a data option; the options are: {', '.join(sorted(valid))}" for k in sorted(set(data) - valid)
    ]
    segment, episode = data.get("segment_len"), data.get("episode_len")
    if _is_int(segment) and _is_int(episode) and episode < segment:
        out.append(
            f"data.episode_len={episode} is shorter than data.segment_len={segment}: an episode holds whole "
            f"segments; set data.episode_len >= {segment} or null"
        )
    align = (data.get("corpus") or {}).get("align_to_segment") if isinstance(data.get("corpus"), dict) else None
    if _is_int(align) and align > 0 and _is_int(segment):  # a task corpus's aligned layout (data/lengthgen.py)
        if problem := aligned_problem(align, segment, episode, data.get("var_len")):
            out.append(problem)
    return out


def _trainer_problems(cfg: DictConfig) -> list[str]:
    out = []
    trainer = _value(cfg, "trainer")
    if isinstance(trainer, dict) and str(trainer.get("_target_", "")).endswith("Trainer"):
        valid = set(inspect.signature(lightning.Trainer.__init__).parameters) - {"self"}
        for key in sorted(set(trainer) - valid - {"_target_"}):
            close = difflib.get_close_matches(key, sorted(valid), n=1)
            out.append(
                f"trainer.{key} is not an argument of lightning.Trainer"
                + (f" (did you mean trainer.{close[0]}?)" if close else "")
            )
    precision = _value(cfg, "trainer.precision")
    if precision is not _MISSING:
        valid = lightning_precisions()
        if precision not in valid:
            out.append(
                f"trainer.precision={shown(precision)} is not a Lightning precision; valid: "
                f"{', '.join(str(p) for p in valid if isinstance(p, str) and '-' in p)}"
            )
    for key, registered, kind in (
        ("strategy", StrategyRegistry.available_strategies(), Strategy),
        ("accelerator", ["gpu", *sorted(AcceleratorRegistry.available_accelerators())], Accelerator),
    ):  # what Lightning's Trainer takes: "auto", a registered name (a strategy's in any case), or an instance
        value = _value(cfg, f"trainer.{key}")
        if value is _MISSING:
            continue
        if isinstance(value, dict):
            out.append(_target_problem(f"trainer.{key}", _node(cfg, f"trainer.{key}"), kind))
        elif not (isinstance(value, str) and (value.lower() if key == "strategy" else value) in ("auto", *registered)):
            variants = "_find_unused_parameters_"  # each ddp strategy twice more: listed once
            names = [n for n in registered if variants not in n]
            more = f" (each ddp* also as *{variants}true|false)" if len(names) < len(registered) else ""
            out.append(
                f"trainer.{key}={shown(value)} is not a Lightning {key}; valid: auto, {', '.join(names)}{more}, or a "
                f"Lightning {kind.__name__} by _target_"
            )
    devices, nodes, batch = (_value(cfg, k) for k in ("trainer.devices", "trainer.num_nodes", "data.batch_size"))
    if devices is not _MISSING and not (
        devices in ("auto", -1) or (_is_int(devices) and devices >= 1) or isinstance(devices, (list, ListConfig))
    ):
        out.append(f"trainer.devices must be an integer >= 1, -1, a list or 'auto', got {shown(devices)}")
    if (
        _is_int(devices)
        and _is_int(nodes)
        and _is_int(batch)
        and min(devices, nodes) >= 1
        and batch % (devices * nodes)
    ):
        out.append(
            f"data.batch_size={batch} (the global batch) is not divisible by trainer.devices x trainer.num_nodes "
            f"= {devices * nodes}"
        )
    return [p for p in out if p]


def _node(cfg: DictConfig, key: str) -> Any:
    """The node at ``key`` unresolved (a logger's save_dir is ${run_dir}, which a sweep check leaves unset)."""
    return OmegaConf.select(cfg, key, default=None, throw_on_missing=False)


def _target_problem(key: str, node: DictConfig, kind: type) -> str | None:
    """Why Hydra could not build ``node`` as a ``kind`` (its ``_target_``) with its keys, or None."""
    target = OmegaConf.select(node, "_target_", default=None)
    if not isinstance(target, str):
        return f"{key} has no _target_: it is a {kind.__name__} by its class, e.g. {key}._target_=MODULE.CLASS"
    module, _, name = target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as e:
        return f"{key}._target_={target} cannot be imported: {e}"
    if not (isinstance(cls, type) and issubclass(cls, kind)):
        return f"{key}._target_={target} is not a {kind.__module__}.{kind.__name__}"
    params = inspect.signature(cls).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    unknown = sorted(str(k) for k in set(node.keys()) - set(params) if not (k.startswith("_") and k.endswith("_")))
    if unknown:
        valid = ", ".join(k for k, p in params.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL)
        return f"{key}.{unknown[0]} is not an argument of {target}; its arguments: {valid}"
    return None


def _built_problems(cfg: DictConfig) -> list[str]:
    """The logger and the callbacks: each a Lightning Logger or Callback by ``_target_``, with keys its class takes
    (a key added under them is checked here, before anything is built)."""
    out = []
    logger = _node(cfg, "logger")
    if isinstance(logger, DictConfig) and len(logger):  # logger=none: no logger
        out.append(_target_problem("logger", logger, Logger))
    callbacks = _node(cfg, "callbacks")
    for name in callbacks.keys() if isinstance(callbacks, DictConfig) else ():
        node = callbacks.get(name)
        if node is None:  # callbacks.NAME=null drops one
            continue
        out.append(
            _target_problem(f"callbacks.{name}", node, Callback)
            if isinstance(node, DictConfig)
            else f"callbacks.{name} must be a Lightning Callback by _target_ (or null), got {shown(node)}"
        )
    return [p for p in out if p]


def _eval_problems(cfg: DictConfig) -> list[str]:
    """A checkpoint to evaluate (where the config has the key: the Python API checks a part of it), and no other
    scheme than the one it was trained with."""
    out = []
    if "ckpt" in cfg.keys() and (OmegaConf.is_missing(cfg, "ckpt") or _value(cfg, "ckpt") in (None, "")):
        out.append(
            "ckpt is required: posenc-lab eval ckpt=PATH (a checkpoint of posenc-lab train: RUN/checkpoints/last.ckpt)"
        )
    if (scheme := _value(cfg, "posenc.name")) is not _MISSING:
        out.append(
            f"posenc.name={shown(scheme)} cannot be set at evaluation: a checkpoint is evaluated with "
            "the scheme it was trained with (its options, e.g. +posenc.scaling=yarn, can change)"
        )
    return out


def problems(cfg: DictConfig, command: str = "train") -> list[str]:
    """Every problem of ``cfg`` for ``command``: "train" (conf/train.yaml: a run), "sweep" (the same, for a
    sweep trial: no data is loaded either way) or "eval" (conf/eval.yaml)."""
    if command not in COMMANDS:
        raise ValueError(f"command must be one of {COMMANDS}, got {command!r}")
    if command == "eval":
        return _eval_problems(cfg) + _table_problems(cfg, EVAL_CHECKS)
    out = _table_problems(cfg, TRAIN_CHECKS)
    resume = _value(cfg, "resume")
    if resume is not _MISSING and (resume is True or resume is not None and not isinstance(resume, (str, bool))):
        out.append(f"resume must be auto, null or a checkpoint path, got {shown(resume)}")
    out += _data_problems(cfg) + _model_problems(cfg) + _trainer_problems(cfg) + _built_problems(cfg)
    return list(dict.fromkeys(out))


def check(cfg: DictConfig, command: str = "train") -> None:
    """Raise ConfigError listing every problem of ``cfg`` (one line when there is one)."""
    found = problems(cfg, command)
    if len(found) == 1:
        raise ConfigError(found[0])
    if found:
        raise ConfigError(f"{len(found)} problems in the config:\n" + "\n".join(f"  - {p}" for p in found))
