"""The one Hydra compose of posenc-lab: train, eval, the sweeps, ablate, the report and the tests compose
the configs of ``conf/`` here, with Hydra's public compose API.

    cfg = compose("train", ["posenc=rope", "model.mem_len=0"])      # as `posenc-lab train ...` would

``Composer`` keeps Hydra initialised for many compositions (a sweep's trials) and composes a trial faster:
``hydra.compose`` once per distinct set of group choices and shared overrides, then each trial's own plain
``key=value`` overrides set on a copy with ``OmegaConf.update(cfg, key, value, merge=True)`` (what Hydra
does with them once the defaults list is composed; the value parsed by Hydra's override grammar). A trial
with ``+``, ``++`` or ``~`` overrides of its own is composed whole. Only the hydra node's record of the
overrides (``hydra.overrides``, ``hydra.job.override_dirname``) then lists the shared ones alone.
"""

from __future__ import annotations

import copy
import os
import re
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import hydra.utils
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.initialize import get_gh_backup, restore_gh_from_backup
from omegaconf import DictConfig, OmegaConf

from . import config_dir, grammar
from .defaults import BASE
from .errors import shown

CONF_DIR = Path(config_dir())


def quote(text: str) -> str:
    """``text`` as a quoted Hydra override value, so that ``(``, ``$(``, ``=``, spaces or quotes in a path survive
    the override grammar: ``f"run_dir={quote(path)}"``."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def compose(
    config_name: str = "train",
    overrides: Sequence[str] = (),
    conf_dir: str | os.PathLike = CONF_DIR,
    return_hydra_config: bool = False,
) -> DictConfig:
    """The config ``config_name`` of ``conf_dir`` with ``overrides``, exactly as the command line composes it."""
    with Composer(conf_dir, config_name) as composer:
        return composer.compose(overrides, return_hydra_config=return_hydra_config)


class Composer:
    """Hydra initialised on ``conf_dir`` for the ``with`` block (the previous Hydra state restored after)."""

    def __init__(self, conf_dir: str | os.PathLike = CONF_DIR, config_name: str = "train"):
        self.conf_dir, self.config_name = str(Path(conf_dir).resolve()), config_name
        self._parsed: dict[str, Any] = {}
        self._groups_cfg: dict[tuple[str, ...], DictConfig] = {}
        self._bases: dict[tuple[str, ...], DictConfig] = {}
        self._groups: dict[str, set[str]] = {}
        self._options: dict[str, list[str]] = {}
        self._backup = None

    def __enter__(self) -> Composer:
        self._backup = get_gh_backup()
        GlobalHydra.instance().clear()
        initialize_config_dir(config_dir=self.conf_dir, version_base="1.3")
        return self

    def __exit__(self, *exc: Any) -> None:
        GlobalHydra.instance().clear()
        if self._backup is not None:
            restore_gh_from_backup(self._backup)

    @property
    def _loader(self):
        return GlobalHydra.instance().config_loader()

    def is_group(self, override) -> bool:
        """Hydra's rule: a group override names an existing config group and its value is not a dict."""
        parent, _, leaf = override.key_or_group.rpartition("/")
        if parent not in self._groups:  # the loader reads the search path on every call: once per parent
            self._groups[parent] = set(self._loader.list_groups(parent))
        return leaf in self._groups[parent] and not isinstance(override.value(), dict)

    def top_groups(self) -> list[str]:
        """The config groups at the top of the search path (model, posenc, ...), Hydra's own left out."""
        return sorted(g for g in self._loader.list_groups("") if g != "hydra")

    def group_options(self, group: str) -> list[str]:
        """The options of ``group``; the base that model/ and data/ options inherit is none (``data=default`` has
        no corpus)."""
        if group not in self._options:
            self._options[group] = sorted(o for o in self._loader.get_group_options(group) if o != BASE)
        return self._options[group]

    def parse(self, override: str):
        """One parsed override (cached: trials repeat the same lines)."""
        if override not in self._parsed:
            (self._parsed[override],) = OverridesParser.create().parse_overrides([override])
        return self._parsed[override]

    def compose(self, overrides: Sequence[str], return_hydra_config: bool = True) -> DictConfig:
        return hydra_compose(self.config_name, list(overrides), return_hydra_config=return_hydra_config)

    def compose_trial(self, trial: Sequence[str], shared: Sequence[str]) -> DictConfig:
        """hydra.compose(trial) (see the module doc); ``shared``: the overrides of ``trial`` common to many trials."""
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


_REFERENCE = re.compile(r"\$\{\s*([A-Za-z_][\w.]*)\s*\}")  # ${seed}, ${data.seed}, and inside ${add:${seed},1}


def derived_keys(config: Any, root: str = "seed") -> set[str]:
    """The dotted keys of a composed, unresolved config (plain containers, ``${...}`` as text) whose value derives
    from ``root`` through interpolations, ``root`` included: ``data.seed: ${seed}``, and a key that interpolates
    such a key (or a node holding one). What varies with the seed is read from the config itself, not listed."""
    refs: dict[str, set[str]] = {}

    def walk(node: Any, prefix: str) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in items:
            if isinstance(v, str) and (names := set(_REFERENCE.findall(v))):
                refs[f"{prefix}{k}"] = names
            walk(v, f"{prefix}{k}.")

    walk(config, "")
    derived, grew = {root}, True
    while grew:  # a fixed point: interpolations may chain
        new = {
            k
            for k, names in refs.items()
            if k not in derived
            and any(n == d or d.startswith(f"{n}.") or n.startswith(f"{d}.") for n in names for d in derived)
        }
        derived |= new
        grew = bool(new)
    return derived


# Where ``+KEY=VALUE`` may add a key that the config files lack: under a node whose keys an owner checks
# (checks.py: ModelConfig's fields, the scheme's options, the data module's and the corpus's options,
# lightning.Trainer's arguments, the logger's class) and a new callback by _target_. Anywhere else such a key
# is read by nothing: a typo (+optim.lrr=0.1) that would train without a word.
ADDABLE = {
    "train": ("model", "posenc", "data", "trainer", "logger", "callbacks"),
    "eval": ("posenc", "data"),  # the scheme's options and the data options of the run (conf/eval.yaml)
}
MULTIRUN_FLAGS = ("-m", "--multirun")


def override_problem(config_name: str, overrides: Sequence[str], command: str) -> str | None:
    """Why Hydra would refuse a command line's overrides, or train with one unread, in one line that names what is
    valid; None when nothing is found here. Hydra's own messages for these name no valid key, or suggest ``+key=``
    for a misspelled one ("Key 'mem_lenn' is not in struct ... To append to your config use +model.mem_lenn=32");
    a ``+key`` it adds silently wherever ``ADDABLE`` does not declare it (``+optim.lrr=0.1``); a value its grammar
    cannot read (a path with a space) gets the quoted form. A sweep (``-m``: ``job_problems``), a flag, ``++``/``~``
    overrides and ``hydra.*`` keys are left to Hydra. Costs one composition (about 0.1 s), before anything else is
    read or created; a second one only to name a refused group.

    ``overrides``: the command line's arguments after the command; ``command``: ``train`` or ``eval``."""
    with Composer(CONF_DIR, config_name) as composer:
        if any(o.startswith("-") for o in overrides):  # Hydra's flags (--cfg job ...): the overrides' grammar only
            return _grammar_problems(composer, grammar.without_flags(overrides), command)
        return _override_problem(composer, overrides, command)


def grammar_problem(config_name: str, overrides: Sequence[str], command: str) -> str | None:
    """The first override Hydra's grammar cannot read, in the project's one line naming it and the nearest valid
    form (``grammar.problem``); None when every one reads. ``overrides``: a command line's arguments (Hydra's flags
    are left out). Costs one parse an override when they read, a composition or two when one does not."""
    if any(o.startswith("-") for o in overrides):
        overrides = grammar.without_flags(overrides)
    with Composer(CONF_DIR, config_name) as composer:
        return _grammar_problems(composer, overrides, command)


def _grammar_problems(composer: Composer, overrides: Sequence[str], command: str) -> str | None:
    """The first of ``overrides`` Hydra's grammar cannot read, in one line (``grammar.problem``); None if all read."""
    for override in overrides:
        if not grammar.reads(composer, override):
            return _unquoted_problem(composer, override) or grammar.problem(composer, override, overrides, command)
    return None


def _override_problem(composer: Composer, overrides: Sequence[str], command: str) -> str | None:
    if problem := _grammar_problems(composer, overrides, command):
        return problem
    parsed = [composer.parse(o) for o in overrides]
    if any(p.is_sweep_override() for p in parsed):
        return None
    plain = [
        p
        for p in parsed
        if not (p.is_force_add() or p.is_delete() or p.package is not None)
        and p.key_or_group.split(".")[0].split("/")[0] != "hydra"
    ]
    groups = [p for p in plain if composer.is_group(p)]
    keys = [p for p in plain if not composer.is_group(p)]
    for p in groups:  # the loader lists a group's options without composing
        options = composer.group_options(p.key_or_group)
        if p.value() is not None and p.value() not in options:
            return f"{p.input_line} is not an option of {p.key_or_group}; the options are: {', '.join(options)}"
    try:
        cfg = composer.groups_config([p.input_line for p in groups])
    except Exception:  # noqa: BLE001 - a group this command does not take, or a choice Hydra refuses
        return _group_not_taken(composer, groups, command)
    addable = ADDABLE.get(command, ())
    for p in keys:
        if p.is_add() and p.key_or_group.split(".")[0] in addable:
            continue  # its owner checks it (checks.py)
        parts = p.key_or_group.split(".")
        node, depth = cfg, 0
        while depth < len(parts) - 1 and isinstance(node, DictConfig) and parts[depth] in node.keys():
            node, depth = node._get_node(parts[depth]), depth + 1  # unresolved: interpolations may need run_dir
        if not isinstance(node, DictConfig) or parts[depth] in node.keys():  # keys(): also those still ???
            continue  # a key that exists (Hydra refuses +key there itself), or a value Hydra's own message explains
        valid = ", ".join(sorted(k for k in node.keys() if k != "hydra" and not k.startswith("_")))
        where = ".".join(parts[:depth]) or f"`posenc-lab {command}`"
        added = f"; +KEY adds a key only under {', '.join(addable)}, where it is checked" if p.is_add() else ""
        return f"{'.'.join(parts[: depth + 1])} is not a key of {where}; the keys are: {valid}{added}"
    return None


def unquoted(composer: Composer, override: str) -> tuple[str, str] | None:
    """For an override Hydra's grammar cannot read whose value it reads once quoted (a path with a space or a
    parenthesis, a non-ASCII letter): what it cannot read, in words, and the quoted override; else None. The one
    quoting hint of the command line (train, eval) and of sweep files (sweeps/check.py)."""
    try:
        composer.parse(override)
        return None
    except Exception:  # noqa: BLE001 - the grammar's error
        pass
    key, sep, value = override.partition("=")
    if not sep or not value or value.startswith(("[", "{", "'", '"')):
        return None  # a list, a mapping or a quote gone wrong: Hydra's message says where
    quoted = f"{key}={quote(value)}"
    try:
        composer.parse(quoted)
    except Exception:  # noqa: BLE001 - not a matter of quoting
        return None
    bad = []  # the characters to name: the grammar reads ASCII letters, digits, spaces and -+./$%*@?|: unquoted
    for c in dict.fromkeys(value):
        try:
            composer.parse(f"k=a{c}a")
        except Exception:  # noqa: BLE001 - this character needs quotes
            bad.append(c)
        if len(bad) == 5:
            break
    if not bad:
        return None  # not the characters (a 5000-digit number, say): Hydra's message says what
    return (
        f"Hydra's override grammar cannot read the character(s) {', '.join(map(repr, bad))} in this value unquoted",
        quoted,
    )


def _unquoted_problem(composer: Composer, override: str) -> str | None:
    """``unquoted``'s hint for a command line: the quoted form, to type in the shell; else None."""
    found = unquoted(composer, override)
    if found is None:
        return None
    reason, quoted = found
    typed = f'"{quoted}"' if not set(quoted) & set('"$`\\!') else shlex.quote(quoted)
    typed = shown(typed, quote=False)
    return f"{shown(override, quote=False)}: {reason}; quote it for Hydra, inside the shell's quotes: {typed}"


def job_problems(
    config_name: str, overrides: Sequence[str], command: str, validate: Callable[[DictConfig], list[str]]
) -> list[str] | None:
    """Every problem of every job of a multirun command line (``-m``), before the first job starts: the job list
    is the configured sweeper's own (``split_arguments`` of Hydra's basic sweeper, with ``hydra.sweeper.params``);
    each job's overrides are checked as ``override_problem`` checks one command line, and its config, composed
    here, by ``validate`` (the one validator). None where the sweeper makes its jobs as it goes (it has no
    ``split_arguments``, e.g. Optuna's): each job is then checked as it starts. Each problem reads
    ``job N (its swept overrides): ...`` (once, with the other jobs that have it), N as in Hydra's job numbers and
    the jobs' run directories.

    ``overrides``: the command line's arguments after the command, without ``-m``."""
    with Composer(CONF_DIR, config_name) as composer:
        if problem := _grammar_problems(composer, overrides, command):
            return [problem]
        parsed = [composer.parse(o) for o in overrides]
        settings = [p.input_line for p in parsed if p.is_hydra_override() and not p.is_sweep_override()]
        try:
            sweeper = composer.compose(settings).hydra.sweeper
            split = getattr(hydra.utils.get_class(sweeper._target_), "split_arguments", None)
        except Exception:  # noqa: BLE001 - a Hydra setting Hydra itself refuses, with its message
            return None
        if split is None:
            return None
        params = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
        task = [p.input_line for p in parsed if not p.is_hydra_override()]
        parser = OverridesParser.create(config_loader=composer._loader)
        try:
            jobs = [job for batch in split(parser.parse_overrides(params + task), None) for job in batch]
        except Exception:  # noqa: BLE001 - a sweep the sweeper refuses (an interval), with its message
            return None
        shared = [o for o in jobs[0] if all(o in job for job in jobs)]
        where: dict[str, list[int]] = {}  # problem -> the jobs that have it
        for number, job in enumerate(jobs):
            problem = _override_problem(composer, job, command)
            try:
                found = [problem] if problem else validate(composer.compose_trial(job, shared))
            except Exception as e:  # noqa: BLE001 - what Hydra refuses in this job, in its words
                found = [f"does not compose: {str(e).strip().splitlines()[0]}"]
            for p in found:
                where.setdefault(p, []).append(number)
        out = []
        for problem, numbers in where.items():
            swept = " ".join(o for o in jobs[numbers[0]] if o not in shared)
            also = f" (also job{'s' * (len(numbers) > 2)} {', '.join(map(str, numbers[1:]))})" * (len(numbers) > 1)
            out.append(f"job {numbers[0]} ({swept}){also}: {problem}")
        return out


def _group_not_taken(composer: Composer, groups: list, command: str) -> str | None:
    """The first of ``groups`` (parsed group overrides) that is not in the command's defaults list, in words; None
    if all are (then Hydra's own message explains the refusal)."""
    base = composer.compose([], return_hydra_config=True)
    chosen = {k for k in base.hydra.runtime.choices if not k.startswith("hydra/")}
    for p in groups:
        group = p.key_or_group
        if group not in chosen:
            node = OmegaConf.select(base, group.replace("/", "."))
            keys = f"; set its keys as {group}.KEY=VALUE" if isinstance(node, DictConfig) else ""
            takes = ", ".join(sorted(chosen))
            return f"{p.input_line}: `posenc-lab {command}` takes no {group} group (its groups: {takes}){keys}"
    return None
