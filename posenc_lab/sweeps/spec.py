"""A wandb sweep file as posenc-lab reads it: ``method``, ``metric``, ``parameters`` and a ``command`` that
runs ``python -m posenc_lab.train`` with ``${args_no_hyphens}`` (the agent's ``key=value`` Hydra overrides)
plus fixed overrides. The agent formats every value with Python's ``str`` (``f"{key}={value}"``), so a YAML
``null`` reaches Hydra as the text ``None``; ``format_override`` formats values the same way.

A sweep file runs posenc-lab's trainer and nothing else: its command is one of ``TRAIN_COMMANDS`` followed by
Hydra overrides, it has no ``program``, and its overrides set values and the run directory, never a flag, a
class for Hydra to build or another Hydra setting (``override_problem``). ``wandb agent`` runs anything else.

``load_sweep(path)`` parses a file and checks its structure (no Hydra yet), or raises ``SweepError`` listing
every problem; ``check.py`` then checks every trial against the real config.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import PosencLabError

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
# The commands a sweep file may run: posenc-lab's own trainer, as wandb's agent spells them (``${env}`` is
# /usr/bin/env, ``${interpreter}`` python); the runner runs each with this Python (command.command_prefix).
_INTERPRETERS = ("${interpreter}", "python", "python3")
TRAIN_COMMANDS: tuple[tuple[str, ...], ...] = tuple(
    (*env, *trainer)
    for env in ((), ("${env}",))
    for trainer in (*((python, "-m", ENTRY_MODULE) for python in _INTERPRETERS), ("posenc-lab", "train"))
)
TRAIN_COMMAND_FORMS = f"[${{env}}] {'|'.join(_INTERPRETERS)} -m {ENTRY_MODULE} or [${{env}}] posenc-lab train, then"
# What a sweep file's overrides may not hold: a class for Hydra to instantiate, or text that becomes a node
# (which could hold one); and the Hydra settings it may make (the run directory).
CODE_MARKERS = ("_target_", "oc.decode", "oc.create")
HYDRA_KEYS = ("hydra.run.dir", "hydra.sweep.dir", "hydra.sweep.subdir")


class SweepError(PosencLabError, ValueError):
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


def overrides_start(command: list[str]) -> int | None:
    """Where the Hydra overrides start in a command that runs posenc-lab's own trainer (one of
    ``TRAIN_COMMANDS``, from its first element); None for any other command."""
    for prefix in TRAIN_COMMANDS:
        if tuple(command[: len(prefix)]) == prefix:
            return len(prefix)
    return None


def override_problem(override: str, where: str) -> str | None:
    """Why a sweep file may not pass ``override`` to the trainer, or None: a sweep file sets config values and the
    run directory; a flag, a Hydra setting or an object of the file's choosing is given on the command line."""
    key = override_key(override)
    if override.startswith("-"):
        return (
            f"{where} {override!r} is a flag, not a Hydra override: a sweep file passes key=value overrides only "
            f"(wandb agent runs the file as written)"
        )
    if marker := next((m for m in CODE_MARKERS if m in override), None):
        return (
            f"{where} {override!r} could have Hydra build an object the file chooses ({marker}): a sweep file sets "
            f"values, not code; give it on the posenc-lab sweep command line, or run the file with wandb agent"
        )
    if key.split(".")[0].split("/")[0] == "hydra" and key not in HYDRA_KEYS:
        return (
            f"{where} {override!r} sets Hydra itself; a sweep file may set only {', '.join(HYDRA_KEYS)} of it "
            f"(hydra/launcher=slurm and the like go on the posenc-lab sweep command line; wandb agent runs the file "
            f"as written)"
        )
    return None


def _split_command(command: Any, problems: list[str]) -> tuple[list[str], list[str]]:
    """The fixed overrides before and after ${args_no_hyphens}; problems for a command that would run anything
    but posenc-lab's trainer with Hydra overrides (each one named)."""
    if not isinstance(command, list) or not all(isinstance(c, (str, int, float)) for c in command):
        problems.append(f"command: a list of strings, {TRAIN_COMMAND_FORMS} {ARGS_MACRO} ..., got {command!r}")
        return [], []
    command = [str(c) for c in command]
    used = [m for m in OTHER_ARGS_MACROS if m in command]
    if used:
        problems.append(f"command: {used} pass arguments Hydra cannot read (e.g. --key=value); use {ARGS_MACRO}")
    start = overrides_start(command)
    if start is None:
        problems.append(
            f"command {command} does not run posenc-lab's trainer, and posenc-lab sweep runs nothing else: "
            f"write {TRAIN_COMMAND_FORMS} {ARGS_MACRO} [overrides] (wandb agent remains the way to run other "
            f"programs)"
        )
        return [], []
    if ARGS_MACRO not in command[start:]:
        problems.append(f"command: {ARGS_MACRO} is missing, so the swept parameters would never reach the trainer")
        return [], []
    if command.count(ARGS_MACRO) > 1:
        problems.append(f"command: {ARGS_MACRO} appears more than once")
    idx = command.index(ARGS_MACRO)
    rest = [c for c in command[start:] if c != ARGS_MACRO]
    macros = [c for c in rest if c.startswith("${") and c.endswith("}")]
    if macros:
        problems.append(f"command: unexpected macro(s) {macros} among the Hydra overrides")
    problems += [p for c in rest if c not in macros and (p := override_problem(c, "command override"))]
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
        problems.append("metric: needs a name (a key the training logs, e.g. val/bpb) and a goal")
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
                elif problem := override_problem(format_override(name, v), "parameter"):
                    problems.append(problem)
            parameters[name] = [v for v in values if v is not None]
    if "program" in spec:  # wandb's agent runs it through ${program}; posenc-lab sweep runs only the trainer
        problems.append(
            f"program: {spec['program']!r}: posenc-lab sweep runs only posenc-lab's own training command, never a "
            f"program; remove program (the command runs {ENTRY_MODULE}); wandb agent remains the way to run others"
        )
    before, after = _split_command(spec.get("command"), problems)
    sweep = Sweep(path=path, spec=spec, method=method, metric=metric, parameters=parameters, before=before, after=after)
    fixed_keys = {override_key(o): o for o in sweep.fixed}
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
        raise SweepError(format_problems(path, problems))
    return sweep


def override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def format_problems(path: Path, problems: Sequence[str]) -> str:
    unique = list(dict.fromkeys(problems))
    return f"{path}: {len(unique)} problem(s), nothing was run:\n" + "\n".join(f"  - {p}" for p in unique)


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
    fixed = [o for o in sweep.fixed if override_key(o) not in dropped]
    swept = []
    for name, values in sweep.parameters.items():
        swept.append(f"{name}=" + ",".join(_hydra_value(v) for v in values))
    return fixed + swept


def _hydra_value(v: Any) -> str:
    text = str(v)
    if isinstance(v, list):
        return text.replace(" ", "")
    return text
