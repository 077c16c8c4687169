"""A wandb sweep file as posenc-lab reads it: ``method``, ``metric``, ``parameters`` and a ``command`` that
runs ``python -m posenc_lab.train`` with ``${args_no_hyphens}`` (the agent's ``key=value`` Hydra overrides)
plus fixed overrides. The agent formats every value with Python's ``str`` (``f"{key}={value}"``), so a YAML
``null`` reaches Hydra as the text ``None``; ``format_override`` formats values the same way.

A sweep file runs posenc-lab's trainer and nothing else: its command is one of ``TRAIN_COMMANDS`` followed by
Hydra overrides, it has no ``program``, and its overrides set values and the run directory, never a flag, a
class for Hydra to build or another Hydra setting (``override_problem``). ``wandb agent`` runs anything else.

``load_sweep(path)`` parses a file and checks its structure (no Hydra yet), or raises ``SweepError`` listing
every problem; ``check.py`` then checks every trial against the real config. wandb's own sweep schema (the
``sweeps`` package's: the fields and types of ``method``, ``metric`` and each parameter, min < max, the
probabilities) judges the structure; posenc-lab adds what its runs need: a metric, no nested parameters, values
that reach Hydra as written, the command above, and bounds on what a file may expand to.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import PosencLabError, shown
from .engine import plain

with warnings.catch_warnings():  # sweeps 0.2 declares pydantic v1-style models: v2 warns on import, harmlessly
    warnings.simplefilter("ignore")
    from sweeps.config import schema as wandb_schema
    from sweeps.config.schema import check_for_deprecated_distributions, validate_categorical_prob, validate_min_max
    from sweeps.params import PARAM_DEPRECATION_MAP, HyperParameter

ENTRY_MODULE = "posenc_lab.train"
# The methods wandb's engine proposes trials for; its schema also takes custom, where a controller of one's own
# proposes them.
METHODS = ("grid", "random", "bayes")
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
# What a sweep file may expand to, before anything reads it: YAML nodes with every alias counted as often as it is
# used (nine nested aliases, 1 KB, expand to 9**9 values: a "billion laughs"), values of one parameter, and trials
# (grid points, or the values checked of a random or bayes search: spec.Sweep.combinations).
MAX_YAML_NODES = 100_000
MAX_VALUES = 1000
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


def _leaves(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The alternatives a schema allows: itself, or those of each branch of its anyOf."""
    return [leaf for branch in schema["anyOf"] for leaf in _leaves(branch)] if "anyOf" in schema else [schema]


# The forms a parameter may take in wandb's schema, as (definition name, schema), in the schema's order: each form
# of a distribution, with the fields it allows. wandb's nested form (parameters: inside a parameter) has no
# distribution and is not here: posenc-lab refuses it before the schema (the agent would pass a dict).
_SCHEMA = wandb_schema.dereferenced_sweep_config_jsonschema
_FORMS = [
    (name, leaf)
    for name in (
        ref["$ref"].split("/")[-1] for ref in wandb_schema.sweep_config_jsonschema["definitions"]["parameter"]["anyOf"]
    )
    for leaf in _leaves(_SCHEMA["definitions"][name])
    if "distribution" in leaf["properties"]
]
# The distributions named on an unknown one: the schema's, less those wandb's checks refuse as deprecated (min and
# max as natural logs)
_DISTRIBUTIONS = sorted(
    {
        d
        for name, form in _FORMS
        if name not in PARAM_DEPRECATION_MAP
        for d in form["properties"]["distribution"]["enum"]
    }
)
# The forms that need no distribution, as the fields each needs: {values}, {values, probabilities}, {min, max}, {value}
_PLAIN_FORMS = ", ".join(
    dict.fromkeys(
        "{" + ", ".join(form["required"]) + "}" for _, form in _FORMS if "distribution" not in form["required"]
    )
)


def _schema_problems(spec: dict[str, Any]) -> tuple[list[str], set[Any]]:
    """What wandb's sweep schema refuses in the file's method, metric and parameters (its jsonschema, with the
    validator ``sweeps.config.schema_violations_from_proposed_config`` uses), each problem named by where it is;
    and the names of the parameters it refuses (their values are not checked further). A refused parameter is
    worded by ``_explain``: wandb's one line for it repeats the whole mapping. ``_parameter_values`` makes wandb's
    other checks of a parameter."""
    config = {k: spec[k] for k in ("method", "metric", "parameters") if k in spec}
    problems, refused = [], set()
    for error in wandb_schema.validator.iter_errors(config):
        path = list(error.absolute_path)
        if path[:1] == ["parameters"] and len(path) > 1:
            name, pspec = path[1], config["parameters"][path[1]]
            refused.add(name)
            if not (isinstance(pspec, dict) and "parameters" in pspec):  # nested: refused with its own reason
                problems += [f"parameter {shown(name)}: {p}" for p in _explain(pspec)]
        elif "propertyNames" in error.absolute_schema_path:
            name = error.instance
            refused.add(name)
            hint = (
                "; Hydra's +key, ~key and group/option overrides go in the command (fixed), not in parameters"
                if name[:1] in ("+", "~") or "/" in name
                else ""
            )
            problems.append(f"parameter {shown(name)}: {error.message} (wandb's rule for a parameter's name){hint}")
        else:
            where = ".".join(map(str, path))
            problems.append(f"{where}: {error.message}" if where else error.message)
    return problems, refused


def _explain(spec: Any) -> list[str]:
    """Why ``spec`` is none of wandb's parameter forms, from the schema: an unknown distribution with the known
    ones; otherwise what the form it comes closest to (the fewest fields it does not have, then the fewest
    violations) refuses, field by field."""
    keys = set(spec) if isinstance(spec, dict) else set()
    if "distribution" in keys:
        dist = spec["distribution"]
        forms = [form for _, form in _FORMS if dist in form["properties"]["distribution"]["enum"]]
        if not forms:
            return [f"unknown distribution {shown(dist)}; wandb's distributions: {', '.join(_DISTRIBUTIONS)}"]
    else:
        forms = [form for _, form in _FORMS if set(form["required"]) <= keys]
        if not forms:
            return [
                f"{shown(spec)} is none of wandb's parameter forms: {_PLAIN_FORMS}, or a distribution "
                f"({', '.join(_DISTRIBUTIONS)}) with its fields"
            ]

    def fit(form: dict[str, Any]) -> tuple[tuple[int, int], list, dict[str, Any]]:
        errors = list(wandb_schema.validator.evolve(schema=form).iter_errors(spec))
        return (len(keys - set(form["properties"])), len(errors)), errors, form

    _, errors, form = min((fit(form) for form in forms), key=lambda f: f[0])
    lines: dict[tuple[str, str], str] = {}
    for error in errors:
        where = ".".join(map(str, error.relative_path))
        text = f"{where}: {error.message}" if where else error.message
        if error.validator == "additionalProperties":
            kind = form["properties"]["distribution"]["enum"][0]
            text += f"; {kind} takes {', '.join(form['properties'])}"
        # one line for a field's type and its format ("integer" is both): they say the same
        lines.setdefault((where, "type" if error.validator == "format" else error.validator), text)
    return list(lines.values())


def _parameter_values(name: str, spec: dict[str, Any], method: str, problems: list[str]) -> list[Any]:
    """The values of a parameter that wandb's jsonschema takes, to check against the config: each of its values;
    the ends of a range, min and max as written; the median of a distribution without ends, as wandb's engine
    computes it (mu of a normal, e^mu of a log-normal). Problems: wandb's checks that its jsonschema cannot make
    (min < max, the probabilities, a deprecated distribution), more than MAX_VALUES values, a grid's range."""
    where = f"parameter {shown(name)}"
    violations = []
    for check in (validate_min_max, validate_categorical_prob, check_for_deprecated_distributions):
        try:
            check(name, spec)
        except ValueError as e:  # wandb's message starts with the name, which the problem line gives first
            violations.append(re.sub(rf"^(Parameter )?{re.escape(name)}:? ", "", str(e.args[0])))
    if violations:
        problems += [f"{where}: {v}" for v in dict.fromkeys(violations)]
        return []
    param = HyperParameter(name, spec)  # wandb's reading: the form the schema matched, its defaults filled in
    config = param.config
    if param.type == HyperParameter.CONSTANT:
        return [config["value"]]
    if "values" in config:
        values = config["values"]
        if len(values) > MAX_VALUES:
            problems.append(f"{where}: {len(values)} values, more than the {MAX_VALUES} a parameter may have; split it")
            return []
        return list(values)
    if method == "grid":
        problems.append(f"{where}: method grid needs a list of values (or one value), not a distribution")
        return []
    if "min" in config:  # as written: wandb's ppf at 0 gives exp(log(min)) for a log range, min - 1 for int_uniform
        ends = [config["min"], config["max"]]
        return ends if param.type == HyperParameter.INT_UNIFORM else [float(x) for x in ends]
    return [plain(param.ppf(0.5))]  # a normal's range has no ends: its median


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
            f"{where} {shown(override)} is a flag, not a Hydra override: a sweep file passes key=value overrides only "
            f"(wandb agent runs the file as written)"
        )
    if marker := next((m for m in CODE_MARKERS if m in override), None):
        return (
            f"{where} {shown(override)} could have Hydra build an object the file chooses ({marker}): a sweep file "
            f"sets values, not code; give it on the posenc-lab sweep command line, or run the file with wandb agent"
        )
    if key.split(".")[0].split("/")[0] == "hydra" and key not in HYDRA_KEYS:
        return (
            f"{where} {shown(override)} sets Hydra itself; a sweep file may set only {', '.join(HYDRA_KEYS)} of it "
            f"(hydra/launcher=slurm and the like go on the posenc-lab sweep command line; wandb agent runs the file "
            f"as written)"
        )
    return None


def _split_command(command: Any, problems: list[str]) -> tuple[list[str], list[str]]:
    """The fixed overrides before and after ${args_no_hyphens}; problems for a command that would run anything
    but posenc-lab's trainer with Hydra overrides (each one named)."""
    if not isinstance(command, list) or not all(isinstance(c, (str, int, float)) for c in command):
        problems.append(f"command: a list of strings, {TRAIN_COMMAND_FORMS} {ARGS_MACRO} ..., got {shown(command)}")
        return [], []
    command = [str(c) for c in command]
    used = [m for m in OTHER_ARGS_MACROS if m in command]
    if used:
        problems.append(f"command: {shown(used)} pass arguments Hydra cannot read (e.g. --key=value); use {ARGS_MACRO}")
    start = overrides_start(command)
    if start is None:
        problems.append(
            f"command {shown(command, quote=False)} does not run posenc-lab's trainer, and posenc-lab sweep runs "
            f"nothing else: write {TRAIN_COMMAND_FORMS} {ARGS_MACRO} [overrides] (wandb agent remains the way to run "
            f"other programs)"
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
        problems.append(f"command: unexpected macro(s) {shown(macros)} among the Hydra overrides")
    problems += [p for c in rest if c not in macros and (p := override_problem(c, "command override"))]
    before = [c for c in command[start:idx] if c not in macros]
    after = [c for c in command[idx + 1 :] if c not in macros]
    return before, after


def read_yaml(path: Path) -> Any:
    """The YAML document of ``path`` as ``yaml.safe_load`` reads it, or SweepError in one line: a missing file,
    invalid YAML, or a document that would expand to more than ``MAX_YAML_NODES`` (counted on the composed nodes,
    where an alias is one node, before any Python object is made)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SweepError(f"{path}: no such sweep file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SweepError(f"{path}: cannot be read as a UTF-8 text file ({e})") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_expansion(path, node)
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = " ".join(str(getattr(e, "problem", None) or e).split())
        if getattr(e, "context", None) and getattr(e, "context_mark", None):
            what += f" ({e.context} from line {e.context_mark.line + 1})"
        raise SweepError(f"{path}: not valid YAML{where}: {shown(what, quote=False)}") from None
    except RecursionError:  # the composer recurses once a level
        raise SweepError(f"{path}: nested too deeply for a sweep file (lists or mappings inside each other)") from None
    finally:
        loader.dispose()


def _refuse_expansion(path: Path, root: yaml.Node) -> None:
    """SweepError if the document of ``root`` expands to more than MAX_YAML_NODES nodes, or an alias holds itself;
    the message names the key under which most of it lies (``parameters.seed.values``)."""
    size: dict[int, int] = {}  # id(node) -> the nodes it expands to (aliases shared: a sum over the composed graph)
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    open_: set[int] = set()  # the nodes on the path from the root to the one in hand
    while stack:
        node, done = stack.pop()
        kids = _children(node)
        if done:
            open_.discard(id(node))
            size[id(node)] = 1 + sum(size[id(k)] for k in kids)
            continue
        if id(node) in size:
            continue
        open_.add(id(node))
        stack.append((node, True))
        for k in kids:
            if id(k) in open_:  # an alias back to a node on the path from the root
                raise SweepError(
                    f"{path}: the list or mapping at line {k.start_mark.line + 1} holds an alias of itself, which "
                    f"never ends; a sweep file's values are finite"
                )
            if id(k) not in size:
                stack.append((k, False))
    if size[id(root)] <= MAX_YAML_NODES:
        return
    keys, node = [], root
    while isinstance(node, yaml.MappingNode):  # down the largest value, while one holds most of it
        key, value = max(node.value, key=lambda kv: size[id(kv[1])])
        if size[id(value)] <= MAX_YAML_NODES // 2 or not isinstance(key, yaml.ScalarNode):
            break
        keys.append(key.value)
        node = value
    where = ".".join(keys) or "the file"
    n = size[id(node)]
    count = f"{n:,}" if n < 10**15 else "more than 10^15"
    raise SweepError(
        f"{path}: {shown(where, quote=False)} expands to {count} YAML nodes (every alias *NAME repeats all that its "
        f"anchor holds); a sweep file may expand to {MAX_YAML_NODES:,}: write the values out, with fewer aliases"
    )


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for kv in node.value for n in kv]
    return []


def load_sweep(path: str | os.PathLike) -> Sweep:
    """Parse and structurally check a sweep file (no Hydra yet); raise SweepError on problems."""
    path = Path(path)
    spec = read_yaml(path)
    if not isinstance(spec, dict):
        raise SweepError(f"{path}: a sweep file is a mapping (method, metric, parameters, command)")
    problems, refused = _schema_problems(spec)
    method = spec.get("method")
    if method in _SCHEMA["properties"]["method"]["enum"] and method not in METHODS:
        problems.append(
            f"method: {shown(method)} leaves proposing trials to a controller of your own; posenc-lab sweep runs "
            f"wandb's engine, whose methods are {', '.join(METHODS)}"
        )
    if "metric" not in spec:  # wandb's schema makes it optional: posenc-lab sweep reads each trial's metric
        problems.append("metric: missing; give its name (a key the training logs, e.g. val/bpb) and goal")
    metric = spec["metric"] if isinstance(spec.get("metric"), dict) else {}
    params_spec = spec.get("parameters")
    parameters: dict[str, list[Any]] = {}
    if isinstance(params_spec, dict):
        for name, pspec in params_spec.items():
            if not isinstance(name, str):  # YAML reads 1: or true: as a number or a bool; the schema checks text
                problems.append(f"parameter {shown(name)}: names a Hydra override key (e.g. model.mem_len or posenc)")
                continue
            if isinstance(pspec, dict) and "parameters" in pspec:
                problems.append(
                    f"parameter {shown(name)}: nested parameters are not supported (the agent would pass a dict); "
                    f"write each leaf as a dotted key, e.g. {name}.lr"
                )
                values = []
            elif name in refused:
                values = []
            else:
                values = _parameter_values(name, pspec, method, problems)
            for v in values:
                if v is None:
                    problems.append(
                        f"parameter {shown(name)}: a YAML null reaches Hydra as the text 'None' "
                        f'(wandb writes {shown(name, quote=False)}=None); write the string "null" instead'
                    )
                elif isinstance(v, dict):
                    problems.append(
                        f"parameter {shown(name)}: value {shown(v)}: a mapping cannot be passed as one override"
                    )
                elif isinstance(v, str) and ("," in v and not v.startswith(("[", "{"))):
                    problems.append(
                        f"parameter {shown(name)}: value {shown(v)} contains a comma, which Hydra reads as a "
                        f"multirun sweep; quote it inside the value or avoid the comma"
                    )
                elif problem := override_problem(format_override(name, v), "parameter"):
                    problems.append(problem)
            parameters[name] = [v for v in values if v is not None]
    if "program" in spec:  # wandb's agent runs it through ${program}; posenc-lab sweep runs only the trainer
        problems.append(
            f"program: {shown(spec['program'])}: posenc-lab sweep runs only posenc-lab's own training command, never a "
            f"program; remove program (the command runs {ENTRY_MODULE}); wandb agent remains the way to run others"
        )
    before, after = _split_command(spec.get("command"), problems)
    sweep = Sweep(path=path, spec=spec, method=method, metric=metric, parameters=parameters, before=before, after=after)
    fixed_keys = {override_key(o): o for o in sweep.fixed}
    for name in parameters:
        if name in fixed_keys:
            problems.append(
                f"parameter {shown(name)} is also fixed in the command ({shown(fixed_keys[name])}); one of them would "
                f"silently win: remove it from the command"
            )
    n = math.prod(len(v) for v in parameters.values()) if parameters else 0
    if n > MAX_COMBINATIONS:
        sizes = " x ".join(f"{shown(k, 40, quote=False)}: {len(v)}" for k, v in parameters.items() if len(v) > 1)
        problems.append(
            f"parameters: {n} trials to check ({sizes}), more than the {MAX_COMBINATIONS} a sweep file may have; "
            f"split the sweep"
        )
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
