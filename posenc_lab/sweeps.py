"""Check a wandb sweep file against the real Hydra config before any run starts.

A sweep file (``sweeps/*.yaml``) is what ``wandb sweep`` reads: a ``method``, a ``metric``, the
``parameters`` and a ``command`` that runs ``python -m posenc_lab.train`` with
``${args_no_hyphens}`` (the agent's ``key=value`` Hydra overrides) plus fixed overrides. The
agent formats every value with Python's ``str`` (``f"{key}={value}"``), so a YAML ``null``
reaches Hydra as the text ``None``; this module formats values the same way.

``check_sweep(path)`` composes the config of every combination of the parameters (all grid
points; for a random or Bayesian search every categorical value and both ends of every range)
with Hydra's public compose API on ``conf/`` (the command's fixed overrides included, exactly as
the trial's command line), and validates what is cheap: config keys and config-group options,
``ModelConfig``, the positional scheme (built, and its lengths checked), the data, optimizer and
trainer settings, the metric and the wandb logger. The facts come from their owners: corpus units
from ``posenc_lab.data``, logged metric names from ``posenc_lab.lit``, precisions from
Lightning's ``Trainer`` signature. It returns the override list of every trial, or raises
``SweepError`` naming each bad key or value and what would be valid. Nothing trains and no corpus
is loaded.

    posenc-lab sweep-check sweeps/ablation.yaml            # check; list the trials
    posenc-lab sweep-check sweeps/ablation.yaml --multirun # the same grid as a Hydra multirun
    python -m posenc_lab.sweeps sweeps/*.yaml              # the same without the console script
"""

from __future__ import annotations

import argparse
import copy
import difflib
import itertools
import math
import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

from . import config_dir

CONF_DIR = Path(config_dir())
CONFIG_NAME = "train"
ENTRY_MODULE = "posenc_lab.train"

METHODS = ("grid", "random", "bayes")
SPEC_KEYS = {"value", "values", "distribution", "min", "max", "mu", "sigma", "q", "probabilities", "a", "b"}
DISTRIBUTIONS = {
    "constant",
    "categorical",
    "categorical_w_probabilities",
    "int_uniform",
    "uniform",
    "log_uniform",
    "log_uniform_values",
    "q_uniform",
    "q_log_uniform",
    "q_log_uniform_values",
    "inv_log_uniform",
    "inv_log_uniform_values",
    "normal",
    "q_normal",
    "log_normal",
    "q_log_normal",
    "beta",
    "q_beta",
}
ARGS_MACRO = "${args_no_hyphens}"
OTHER_ARGS_MACROS = (
    "${args}",
    "${args_no_boolean_flags}",
    "${args_json}",
    "${args_json_file}",
    "${args_no_equals}",
    "${args_append_hydra}",
    "${args_override_hydra}",
)
MAX_COMBINATIONS = 5000


class SweepError(ValueError):
    """A sweep file that cannot run as written; the message lists every problem found."""


@dataclass
class Sweep:
    """A parsed sweep file: parameters as candidate values, fixed overrides from the command."""

    path: Path
    spec: dict[str, Any]
    method: str
    metric: dict[str, Any]
    parameters: dict[str, list[Any]]  # name -> values to check (grid: every value)
    before: list[str] = field(default_factory=list)  # command overrides before ${args_no_hyphens}
    after: list[str] = field(default_factory=list)  # ... and after it

    @property
    def fixed(self) -> list[str]:
        return self.before + self.after

    def combinations(self) -> list[list[str]]:
        """The override list of every trial to check, in the order the agent's command has them."""
        names = list(self.parameters)
        trials = []
        for values in itertools.product(*(self.parameters[n] for n in names)):
            trials.append(self.before + [format_override(n, v) for n, v in zip(names, values)] + self.after)
        return trials


def format_override(key: str, value: Any) -> str:
    """``key=value`` exactly as wandb's agent writes it for ``${args_no_hyphens}``."""
    return f"{key}={value}"


# ---- the sweep file ----------------------------------------------------------------------------


def _parameter_values(name: str, spec: Any, method: str, problems: list[str]) -> list[Any]:
    where = f"parameter {name!r}"
    if not isinstance(spec, dict):
        problems.append(f"{where}: expected a mapping such as {{values: [...]}} or {{min: .., max: ..}}, got {spec!r}")
        return []
    if "parameters" in spec:
        problems.append(
            f"{where}: nested parameters are not supported (the agent would pass a dict); "
            f"write each leaf as a dotted key, e.g. {name}.lr"
        )
        return []
    unknown = sorted(set(spec) - SPEC_KEYS)
    if unknown:
        problems.append(f"{where}: unknown field(s) {unknown}; valid: {sorted(SPEC_KEYS)}")
    dist = spec.get("distribution")
    if dist is not None and dist not in DISTRIBUTIONS:
        problems.append(f"{where}: unknown distribution {dist!r}; valid: {sorted(DISTRIBUTIONS)}")
        return []
    if "value" in spec:
        return [spec["value"]]
    if "values" in spec:
        values = spec["values"]
        if not isinstance(values, list) or not values:
            problems.append(f"{where}: values must be a non-empty list, got {values!r}")
            return []
        return list(values)
    if method == "grid":
        problems.append(f"{where}: method grid needs a list of values (or one value), not a distribution")
        return []
    if "min" in spec and "max" in spec:
        lo, hi = spec["min"], spec["max"]
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (lo, hi)) or lo > hi:
            problems.append(f"{where}: min and max must be numbers with min <= max, got {lo!r}, {hi!r}")
            return []
        if dist in ("log_uniform", "q_log_uniform", "inv_log_uniform"):  # bounds are natural logs
            lo, hi = math.exp(lo), math.exp(hi)
            if dist == "inv_log_uniform":
                lo, hi = 1 / hi, 1 / lo
        if dist == "int_uniform" or (dist is None and isinstance(lo, int) and isinstance(hi, int)):
            if not (isinstance(lo, int) and isinstance(hi, int)):
                problems.append(f"{where}: int_uniform needs integer min and max, got {lo!r}, {hi!r}")
                return []
            return sorted({lo, hi})
        return sorted({float(lo), float(hi)})
    if "mu" in spec:  # normal-type distributions: check the centre only
        mu = spec["mu"]
        return [math.exp(mu) if dist in ("log_normal", "q_log_normal") else mu]
    problems.append(f"{where}: give value, values, or min and max (with a distribution)")
    return []


def _split_command(command: Any, problems: list[str]) -> tuple[list[str], list[str]]:
    """The fixed overrides before and after ${args_no_hyphens}; problems for a command that would
    not run posenc_lab.train with Hydra overrides."""
    if not isinstance(command, list) or not all(isinstance(c, (str, int, float)) for c in command):
        problems.append(
            f"command: a list of strings that runs the trainer, e.g. "
            f"[${{env}}, python, -m, {ENTRY_MODULE}, {ARGS_MACRO}], got {command!r}"
        )
        return [], []
    command = [str(c) for c in command]
    used = [m for m in OTHER_ARGS_MACROS if m in command]
    if used:
        problems.append(f"command: {used} pass arguments Hydra cannot read (e.g. --key=value); use {ARGS_MACRO}")
    if ARGS_MACRO not in command:
        problems.append(f"command: {ARGS_MACRO} is missing, so the swept parameters would never reach the trainer")
        return [], []
    if command.count(ARGS_MACRO) > 1:
        problems.append(f"command: {ARGS_MACRO} appears more than once")
    # Where do the overrides start? After `-m posenc_lab.train`, `posenc-lab train` or a train.py program.
    start = None
    for i, c in enumerate(command):
        if c == ENTRY_MODULE and i > 0 and command[i - 1] == "-m":
            start = i + 1
        elif c == "train" and i > 0 and os.path.basename(command[i - 1]) == "posenc-lab":
            start = i + 1
    if "${program}" in command:
        problems.append(
            f"command: ${{program}} runs posenc_lab/train.py as a script, which cannot import its "
            f"package; use [${{env}}, python, -m, {ENTRY_MODULE}, {ARGS_MACRO}]"
        )
    if start is None:
        problems.append(
            f"command: does not run the trainer; expected `-m {ENTRY_MODULE}` (or `posenc-lab train`) "
            f"before {ARGS_MACRO}, got {command}"
        )
        return [], []
    idx = command.index(ARGS_MACRO)
    if idx < start:
        problems.append(f"command: {ARGS_MACRO} comes before the trainer module")
        return [], []
    rest = command[start:]
    macros = [c for c in rest if c.startswith("${") and c.endswith("}") and c != ARGS_MACRO]
    if macros:
        problems.append(f"command: unexpected macro(s) {macros} among the Hydra overrides")
    before = [c for c in command[start:idx] if c not in macros]
    after = [c for c in command[idx + 1 :] if c not in macros]
    return before, after


def load_sweep(path: str | os.PathLike) -> Sweep:
    """Parse and structurally check a sweep file (no Hydra yet); raise SweepError on problems."""
    path = Path(path)
    try:
        spec = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SweepError(f"{path}: no such sweep file") from None
    except yaml.YAMLError as e:
        raise SweepError(f"{path}: not valid YAML: {e}") from None
    problems: list[str] = []
    if not isinstance(spec, dict):
        raise SweepError(f"{path}: a sweep file is a mapping (method, metric, parameters, command)")
    method = spec.get("method")
    if method not in METHODS:
        problems.append(f"method: {method!r} is not one of {list(METHODS)}")
    metric = spec.get("metric")
    if not isinstance(metric, dict) or not isinstance(metric.get("name"), str):
        problems.append("metric: needs a name (a key the training logs, e.g. val/bpt) and a goal")
        metric = {}
    elif metric.get("goal", "minimize") not in ("minimize", "maximize"):
        problems.append(f"metric.goal: {metric.get('goal')!r} is not minimize or maximize")
    params_spec = spec.get("parameters")
    parameters: dict[str, list[Any]] = {}
    if not isinstance(params_spec, dict) or not params_spec:
        problems.append("parameters: needs at least one parameter")
    else:
        for name, pspec in params_spec.items():
            if not isinstance(name, str) or not name or name.startswith("-"):
                problems.append(f"parameter {name!r}: names a Hydra override key (e.g. model.mem_len or posenc)")
                continue
            values = _parameter_values(name, pspec, method, problems)
            for v in values:
                if v is None:
                    problems.append(
                        f"parameter {name!r}: a YAML null reaches Hydra as the text 'None' "
                        f'(wandb writes {name}=None); write the string "null" instead'
                    )
                elif isinstance(v, dict):
                    problems.append(f"parameter {name!r}: value {v!r}: a mapping cannot be passed as one override")
                elif isinstance(v, str) and ("," in v and not v.startswith(("[", "{"))):
                    problems.append(
                        f"parameter {name!r}: value {v!r} contains a comma, which Hydra reads as a "
                        f"multirun sweep; quote it inside the value or avoid the comma"
                    )
            parameters[name] = [v for v in values if v is not None]
    before, after = _split_command(spec.get("command"), problems)
    sweep = Sweep(path=path, spec=spec, method=method, metric=metric, parameters=parameters, before=before, after=after)
    fixed_keys = {_override_key(o): o for o in sweep.fixed}
    for name in parameters:
        key = name.lstrip("+~")
        if key in fixed_keys:
            problems.append(
                f"parameter {name!r} is also fixed in the command ({fixed_keys[key]!r}); one of them would "
                f"silently win: remove it from the command"
            )
    n = math.prod(len(v) for v in parameters.values()) if parameters else 0
    if n > MAX_COMBINATIONS:
        problems.append(f"parameters: {n} combinations to check (more than {MAX_COMBINATIONS}); split the sweep")
    if problems:
        raise SweepError(_format(path, problems))
    return sweep


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _format(path: Path, problems: Sequence[str]) -> str:
    unique = list(dict.fromkeys(problems))
    return f"{path}: {len(unique)} problem(s), nothing was run:\n" + "\n".join(f"  - {p}" for p in unique)


# ---- composing with Hydra ----------------------------------------------------------------------


class Composer:
    """Hydra's public compose API on ``conf_dir``: ``compose(overrides)`` is ``hydra.compose`` (hydra node
    included), as the trial's command line would compose; group names and options come from Hydra's
    config loader. Use as a context manager (it initialises Hydra and restores the previous state).

    ``compose_trial`` gives the same config faster for many trials: ``hydra.compose`` once per distinct set
    of group choices and shared overrides, then each trial's own plain ``key=value`` overrides set on a copy
    with ``OmegaConf.update(cfg, key, value, merge=True)`` (what Hydra does with them once the defaults list
    is composed; the value parsed by Hydra's override grammar). A trial with ``+``, ``++`` or ``~``
    overrides of its own is composed whole. Only the hydra node's record of the overrides
    (``hydra.overrides``, ``hydra.job.override_dirname``) then lists the shared ones alone.
    """

    def __init__(self, conf_dir: str | os.PathLike = CONF_DIR, config_name: str = CONFIG_NAME):
        self.conf_dir, self.config_name = str(Path(conf_dir).resolve()), config_name
        self._parsed: dict[str, Any] = {}
        self._groups_cfg: dict[tuple[str, ...], DictConfig] = {}
        self._bases: dict[tuple[str, ...], DictConfig] = {}
        self._groups: dict[str, set[str]] = {}
        self._options: dict[str, list[str]] = {}
        self._backup = None

    def __enter__(self) -> Composer:
        from hydra import initialize_config_dir
        from hydra.core.global_hydra import GlobalHydra
        from hydra.initialize import get_gh_backup

        self._backup = get_gh_backup()
        GlobalHydra.instance().clear()
        initialize_config_dir(config_dir=self.conf_dir, version_base="1.3")
        return self

    def __exit__(self, *exc: Any) -> None:
        from hydra.core.global_hydra import GlobalHydra
        from hydra.initialize import restore_gh_from_backup

        GlobalHydra.instance().clear()
        if self._backup is not None:
            restore_gh_from_backup(self._backup)

    @property
    def _loader(self):
        from hydra.core.global_hydra import GlobalHydra

        return GlobalHydra.instance().config_loader()

    def is_group(self, override) -> bool:
        """Hydra's rule: a group override names an existing config group and its value is not a dict."""
        parent, _, leaf = override.key_or_group.rpartition("/")
        if parent not in self._groups:  # the loader reads the search path on every call: once per parent
            self._groups[parent] = set(self._loader.list_groups(parent))
        return leaf in self._groups[parent] and not isinstance(override.value(), dict)

    def group_options(self, group: str) -> list[str]:
        if group not in self._options:
            self._options[group] = sorted(self._loader.get_group_options(group))
        return self._options[group]

    def parse(self, override: str):
        """One parsed override (cached: trials repeat the same lines)."""
        if override not in self._parsed:
            from hydra.core.override_parser.overrides_parser import OverridesParser

            (self._parsed[override],) = OverridesParser.create().parse_overrides([override])
        return self._parsed[override]

    def compose(self, overrides: Sequence[str]) -> DictConfig:
        from hydra import compose

        return compose(self.config_name, list(overrides), return_hydra_config=True)

    def compose_trial(self, trial: Sequence[str], shared: Sequence[str]) -> DictConfig:
        """hydra.compose(trial) (see the class doc); ``shared``: the overrides of ``trial`` common to many trials."""
        parsed = [self.parse(o) for o in trial]
        groups = [p.input_line for p in parsed if self.is_group(p)]
        shared_values = [o for o in shared if o not in groups]
        own = [p for p in parsed if p.input_line not in groups and p.input_line not in shared_values]
        if any(p.is_add() or p.is_force_add() or p.is_delete() or p.package is not None for p in own):
            return self.compose(trial)
        key = tuple(groups) + ("|",) + tuple(shared_values)
        if key not in self._bases:
            self._bases[key] = self.compose([*groups, *shared_values])
        cfg = copy.deepcopy(self._bases[key])
        for p in own:
            OmegaConf.update(cfg, p.key_or_group, p.value(), merge=True)
        return cfg

    def groups_config(self, groups: Sequence[str]) -> DictConfig:
        """The config of these group choices alone, for naming missing keys (cached; do not modify)."""
        key = tuple(groups)
        if key not in self._groups_cfg:
            self._groups_cfg[key] = self.compose(groups)
        return self._groups_cfg[key]


def _missing_key_message(cfg: DictConfig, key: str) -> str | None:
    """None if ``key`` (dotted) exists in cfg; else why not, with the valid keys at that level."""
    node: Any = cfg
    parts = key.split(".")
    choices = OmegaConf.select(cfg, "hydra.runtime.choices", default=None) or {}
    for depth, part in enumerate(parts):
        here = ".".join(parts[:depth]) or "the top level"
        if depth == 1 and parts[0] in choices:
            here = f"{parts[0]} (with {parts[0]}={choices[parts[0]]})"
        if isinstance(node, DictConfig):
            if part not in node:
                valid = sorted(str(k) for k in node.keys() if k != "hydra" or depth)
                close = difflib.get_close_matches(part, valid, n=1)
                hint = f" (did you mean {'.'.join(parts[:depth] + [close[0]])!r}?)" if close else ""
                return (
                    f"config key {key!r} does not exist: {here} has no {part!r}{hint}; keys there: {', '.join(valid)}"
                )
            node = node._get_node(part)
            node = node if isinstance(node, (DictConfig, ListConfig)) else None
        elif isinstance(node, ListConfig) and part.isdigit() and int(part) < len(node):
            node = node._get_node(int(part))
            node = node if isinstance(node, (DictConfig, ListConfig)) else None
        elif depth < len(parts):
            return f"config key {key!r} does not exist: {here} is not a mapping"
    return None


# ---- cheap validation of one composed config ---------------------------------------------------


def logged_metrics(cfg: DictConfig) -> set[str]:
    """The metric keys LitLM logs for this config (``posenc_lab.lit.logged_metrics`` for its corpus's unit;
    a corpus unknown here gets both figures and the recall metrics)."""
    from .data import ANSWER_CORPORA, CORPUS_UNITS
    from .metrics import logged_metrics as lit_metrics

    data = str(cfg.data.name)
    unit = CORPUS_UNITS.get(data)
    return lit_metrics(unit, data in ANSWER_CORPORA or unit is None, [int(e) for e in cfg.metrics.distance_buckets])


def lightning_precisions() -> list:
    """The values Lightning's ``Trainer(precision=...)`` accepts, read from its signature."""
    import typing

    import lightning

    def leaves(t) -> list:
        if typing.get_origin(t) is typing.Literal:
            return list(typing.get_args(t))
        return [v for a in typing.get_args(t) for v in leaves(a)]

    return leaves(typing.get_type_hints(lightning.Trainer.__init__)["precision"])


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def validate_config(cfg: DictConfig, metric: dict[str, Any] | None = None, require_wandb: bool = True) -> list[str]:
    """Problems with a composed training config, from checks that need no data and no training."""
    from .data import CORPUS_NAMES
    from .datamodule import SegmentDataModule
    from .model import ModelConfig
    from .positional import build_scheme
    from .train import model_config

    problems: list[str] = []

    def get(key: str) -> Any:
        return OmegaConf.select(cfg, key, throw_on_resolution_failure=False)

    # model + positional scheme
    try:
        # the vocabulary size is the corpus's: any is fine here that leaves room past the adaptive softmax cutoffs
        cutoffs = get("model.adaptive_cutoffs") or [255]
        mc = ModelConfig(**model_config(cfg, vocab_size=max(256, int(cutoffs[-1]) + 1)))
        scheme = build_scheme(mc.posenc, mc.dims, **mc.posenc_kwargs)
        episode = get("data.episode_len")
        scheme.validate(int(get("data.segment_len")), mc.mem_len, int(episode) if _is_int(episode) else 0)
    except (TypeError, ValueError) as e:
        problems.append(f"model/posenc: {e}")
    # data (the corpus is not loaded)
    name = get("data.name")
    if name not in CORPUS_NAMES:
        problems.append(f"data.name={name!r} is not a corpus; valid: {', '.join(CORPUS_NAMES)}")
    for key in ("data.segment_len", "data.batch_size"):
        if not _is_int(get(key)) or get(key) < 1:
            problems.append(f"{key} must be an integer >= 1, got {get(key)!r}")
    episode = get("data.episode_len")
    if episode is not None and (not _is_int(episode) or episode < 1):
        problems.append(f"data.episode_len must be null or an integer >= 1, got {episode!r}")
    try:
        SegmentDataModule(**OmegaConf.to_container(cfg.data, resolve=True))
    except TypeError as e:
        problems.append(f"data: {e}")
    # global batch over DDP ranks
    devices, nodes = get("trainer.devices"), get("trainer.num_nodes")
    if _is_int(devices) and _is_int(nodes) and _is_int(get("data.batch_size")):
        world = devices * nodes
        if get("data.batch_size") % world:
            problems.append(
                f"data.batch_size={get('data.batch_size')} (the global batch) is not divisible by "
                f"trainer.devices x trainer.num_nodes = {world}"
            )
    # optimizer
    lr, warmup = get("optim.lr"), get("optim.warmup_steps")
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not lr > 0:
        problems.append(f"optim.lr must be a number > 0, got {lr!r}")
    if not _is_int(warmup) or warmup < 0:
        problems.append(f"optim.warmup_steps must be an integer >= 0, got {warmup!r}")
    wd, mlr = get("optim.weight_decay"), get("optim.min_lr_ratio")
    if not isinstance(wd, (int, float)) or wd < 0:
        problems.append(f"optim.weight_decay must be a number >= 0, got {wd!r}")
    if not isinstance(mlr, (int, float)) or not 0 <= mlr <= 1:
        problems.append(f"optim.min_lr_ratio must be in [0, 1], got {mlr!r}")
    # trainer (not instantiated: a GPU trainer cannot be built on a CPU machine)
    steps = get("trainer.max_steps")
    if not _is_int(steps) or steps < 1:
        problems.append(f"trainer.max_steps must be an integer >= 1 (training is step-based), got {steps!r}")
    precision = get("trainer.precision")
    valid_precision = lightning_precisions()
    if precision not in valid_precision:
        problems.append(
            f"trainer.precision={precision!r} is not a Lightning precision; valid: "
            f"{', '.join(str(p) for p in valid_precision if isinstance(p, str) and '-' in p)}"
        )
    if not (devices in ("auto", -1) or (_is_int(devices) and devices >= 1) or isinstance(devices, ListConfig)):
        problems.append(f"trainer.devices must be an integer >= 1, -1, a list or 'auto', got {devices!r}")
    if not _is_int(nodes) or nodes < 1:
        problems.append(f"trainer.num_nodes must be an integer >= 1, got {nodes!r}")
    # the logger the sweep reads its metric from
    if require_wandb:
        target = str(get("logger._target_") or "")
        if not target.endswith("WandbLogger"):
            problems.append(
                f"logger: the sweep's metric reaches wandb only through logger=wandb (got "
                f"{target or 'no logger'}); add logger=wandb to the command"
            )
    # the metric
    if metric:
        names = logged_metrics(cfg)
        mname = metric.get("name")
        if mname not in names:
            close = difflib.get_close_matches(str(mname), sorted(names), n=3)
            plain = sorted(n for n in names if "/acc_d" not in n)
            buckets = sorted(
                {n.split("/acc_d", 1)[1] for n in names if "/acc_d" in n},
                key=lambda b: int(b.split("-")[0].rstrip("+")),
            )
            listed = ", ".join(plain)
            if buckets:
                listed += f"; val|test/acc_d<bucket> for buckets {', '.join(buckets)}"
            problems.append(
                f"metric.name={mname!r} is never logged for data={name}"
                + (f" (did you mean {close[0]!r}?)" if close else "")
                + f"; LitLM logs: {listed}"
            )
        goal = metric.get("goal", "minimize")
        leaf = str(mname).rsplit("/", 1)[-1]
        want = "maximize" if leaf.startswith("acc") or leaf == "tokens_per_s" else "minimize"
        if leaf in ("loss", "bpt", "ppl") or leaf.startswith("acc") or leaf == "tokens_per_s":
            if goal != want:
                problems.append(f"metric.goal={goal} for {mname}: that metric should be {want}d")
    return problems


def validate_launcher(cfg: DictConfig) -> list[str]:
    """Problems with the Hydra launcher settings of a config composed with its hydra node."""
    problems: list[str] = []
    launcher = str(OmegaConf.select(cfg, "hydra.launcher._target_", default="") or "")
    if "submitit" in launcher and "Slurm" in launcher:
        for key in ("nodes", "tasks_per_node", "gpus_per_node"):
            try:
                v = OmegaConf.select(cfg, f"hydra.launcher.{key}")
            except Exception as e:  # noqa: BLE001 - an interpolation that cannot resolve
                problems.append(f"hydra.launcher.{key}: {_first_line(e)}")
                continue
            if v is not None and not _is_int(v):
                problems.append(
                    f"hydra.launcher.{key}={v!r}: SLURM needs an integer (hydra/launcher=slurm takes it "
                    f"from trainer.devices and trainer.num_nodes: set those to integers, e.g. "
                    f"trainer.devices=8 trainer.num_nodes=1)"
                )
    return problems


# ---- the checker -------------------------------------------------------------------------------


def check_sweep(
    path: str | os.PathLike,
    conf_dir: str | os.PathLike = CONF_DIR,
    require_wandb: bool = True,
    configs: list | None = None,
) -> list[list[str]]:
    """Validate sweep file ``path`` against the Hydra config in ``conf_dir`` before any run.

    Returns the override list of every checked trial (grid: every trial the agent will run), or
    raises SweepError listing each bad key or value, where it comes from and what is valid.
    ``configs``: a list that receives ``(overrides, composed config)`` of every trial.
    """
    sweep = load_sweep(path)
    problems: list[str] = []
    trials = sweep.combinations()
    with Composer(conf_dir) as composer:
        # 1. Syntax, and every config-group value is an option of its group.
        lines = sweep.fixed + [format_override(k, v) for k, vs in sweep.parameters.items() for v in vs]
        for line in dict.fromkeys(lines):
            src = "command override" if line in sweep.fixed else "parameter"
            try:
                parsed = composer.parse(line)
            except Exception as e:  # noqa: BLE001 - Hydra's grammar errors
                problems.append(f"{src} {line!r} is not a valid Hydra override: {_first_line(e)}")
                continue
            if parsed.is_sweep_override():
                problems.append(
                    f"{src} {line!r} is a multirun sweep (a comma or range in the value); "
                    f"a sweep trial takes one value per key"
                )
                continue
            if composer.is_group(parsed) and not parsed.is_delete():
                value, group = parsed.value(), parsed.key_or_group
                options = composer.group_options(group)
                names = value if isinstance(value, list) else [value]
                for v in names:
                    if v not in options:
                        close = difflib.get_close_matches(str(v), options, n=1)
                        problems.append(
                            f"{src} {line!r}: {v!r} is not an option of config group {group!r}"
                            + (f" (did you mean {close[0]!r}?)" if close else "")
                            + f"; options: {', '.join(options)}"
                        )
        if problems:
            raise SweepError(_format(sweep.path, problems))

        # 2. Every trial composes (as hydra.compose of its command line), every key exists, every value is valid.
        failures: dict[str, list[list[str]]] = {}
        for trial in trials:
            assignment = [o for o in trial if o not in sweep.fixed]
            parsed = [composer.parse(o) for o in trial]
            try:
                raw = composer.groups_config([p.input_line for p in parsed if composer.is_group(p)])
                for p in parsed:
                    if composer.is_group(p) or p.is_add() or p.is_force_add() or p.is_delete():
                        continue
                    msg = _missing_key_message(raw, p.key_or_group)
                    if msg:
                        src = (
                            f"command override {p.input_line!r}"
                            if p.input_line in sweep.fixed
                            else f"parameter {p.key_or_group!r}"
                        )
                        raise SweepError(f"{src}: {msg}")
                cfg = composer.compose_trial(trial, sweep.fixed)
            except SweepError as e:
                failures.setdefault(str(e), []).append(assignment)
                continue
            except Exception as e:  # noqa: BLE001 - Hydra / OmegaConf composition errors
                failures.setdefault(f"does not compose: {_first_line(e)}", []).append(assignment)
                continue
            for p in validate_launcher(cfg) + validate_config(cfg, sweep.metric, require_wandb=require_wandb):
                failures.setdefault(p, []).append(assignment)
            if configs is not None:
                configs.append((trial, cfg))
        for message, assignments in failures.items():
            problems.append(message + _blame(message, assignments, sweep, len(trials)))
    if problems:
        raise SweepError(_format(sweep.path, problems))
    return trials


def _blame(message: str, assignments: list[list[str]], sweep: Sweep, n_trials: int) -> str:
    """Which parameter value(s) a problem comes from: those shared by every trial that has it."""
    if message.startswith("parameter "):
        return ""
    common = set(assignments[0]).intersection(*map(set, assignments[1:]))
    swept = {o for o in common if len(sweep.parameters.get(_override_key(o), [])) > 1}
    if swept:
        return f"  [from parameter {', '.join(sorted(swept))}; {len(assignments)} of {n_trials} trial(s)]"
    if len(assignments) == n_trials:
        return "  [every trial]"
    return f"  [{len(assignments)} of {n_trials} trial(s), e.g. {' '.join(assignments[0])}]"


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return " ".join(text.splitlines()[:3])


def multirun_overrides(path: str | os.PathLike) -> list[str]:
    """The same grid as Hydra multirun overrides (``posenc-lab train -m ...``), without wandb:
    the logger is left at its default and Hydra's sweep directory replaces the per-run dir."""
    sweep = load_sweep(path)
    if sweep.method != "grid" and any(
        len(v) > 1 and "values" not in sweep.spec["parameters"][k] for k, v in sweep.parameters.items()
    ):
        raise SweepError(
            f"{sweep.path}: method {sweep.method} samples ranges; only value lists become a Hydra "
            f"multirun (run the wandb sweep instead)"
        )
    dropped = ("logger", "hydra.run.dir", "logger.group", "logger.tags", "logger.job_type")
    fixed = [o for o in sweep.fixed if _override_key(o) not in dropped]
    swept = []
    for name, values in sweep.parameters.items():
        swept.append(f"{name}=" + ",".join(_hydra_value(v) for v in values))
    return fixed + swept


def _hydra_value(v: Any) -> str:
    text = str(v)
    if isinstance(v, list):
        return text.replace(" ", "")
    return text


# ---- command line ------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="posenc-lab sweep-check",
        description="Validate wandb sweep files against conf/ before any run (every combination composes).",
    )
    parser.add_argument("sweeps", nargs="+", help="sweep YAML files (e.g. sweeps/ablation.yaml)")
    parser.add_argument(
        "--conf-dir", default=str(CONF_DIR), help="Hydra config directory (default: the package's conf/)"
    )
    parser.add_argument("--list", action="store_true", help="print every trial's overrides")
    parser.add_argument(
        "--multirun",
        action="store_true",
        help="print the equivalent `posenc-lab train -m ...` command (grid sweeps; no wandb)",
    )
    args = parser.parse_args(argv)
    status = 0
    for path in args.sweeps:
        try:
            trials = check_sweep(path, conf_dir=args.conf_dir)
        except SweepError as e:
            print(f"FAIL {e}", file=sys.stderr)
            status = 1
            continue
        print(f"ok   {path}: {len(trials)} trial(s) compose into valid configs")
        if args.list:
            for t in trials:
                print("     " + " ".join(shlex.quote(o) for o in t))
        if args.multirun:
            try:
                print("     posenc-lab train -m " + " ".join(shlex.quote(o) for o in multirun_overrides(path)))
            except SweepError as e:
                print(f"     (no multirun: {e})")
    return status


if __name__ == "__main__":
    sys.exit(main())
