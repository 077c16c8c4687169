"""A trial's command line and environment, as wandb's agent would build them, plus what the runner adds.

The sweep file's ``command`` runs with ``${args_no_hyphens}`` replaced by the trial's ``key=value`` overrides
(``format_override``), ``${env}`` dropped (the runner passes the environment itself) and the trainer run by this
Python (``python``, ``${interpreter}`` and ``posenc-lab`` are not looked up on PATH; spec.TRAIN_COMMANDS). The
user's extra overrides come after the command's own; Hydra refuses a key given twice, so an extra override
*replaces* the command's override of the same key (``merge_overrides``). The runner then sets ``run_dir=`` (and
Hydra's run dir to it) and adds the SweepTrial callback (trial.py).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

from ..compose import grammar_problem
from .spec import ENTRY_MODULE, Sweep, SweepError, format_override, override_key, overrides_start

LAUNCHER_GROUP = "hydra/launcher"
RUN_DIR_KEYS = ("run_dir", "hydra.run.dir")
_PLAIN = re.compile(r"^[\w./@:+-]*$")


def _prefix(override: str) -> str:
    return override[: len(override) - len(override.lstrip("+~"))]


def merge_overrides(base: list[str], extra: list[str]) -> list[str]:
    """``base`` with ``extra`` appended, each extra override replacing base's override of the same key.

    Prefixes: ``+key`` adds a key that is not in the config, ``key`` sets one that is, ``~key`` deletes it. When
    the replaced override added the key (``+key=1``) and the extra one sets it (``key=2``), or the other way
    round, the extra one becomes ``++key=2`` (set or add): exactly one of the two would fail in Hydra. A ``~key``
    that removes what the command added drops both.
    """
    extra_keys = {override_key(o): o for o in extra}
    out = [o for o in base if override_key(o) not in extra_keys]
    replaced = {override_key(o): _prefix(o) for o in base if override_key(o) in extra_keys}
    for o in extra:
        prefix, was = _prefix(o), replaced.get(override_key(o))
        if was is not None and prefix == "~" and "+" in was:
            continue  # the command added the key and the user removes it: neither
        if was is not None and prefix != was and {prefix, was} <= {"", "+", "++"}:
            o = "++" + o[len(prefix) :]
        out.append(o)
    return out


def hydra_value(text: str) -> str:
    """A path or text as one Hydra override value: quoted when it holds characters Hydra's grammar reads."""
    if _PLAIN.match(text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def command_prefix(command: list[Any]) -> list[str]:
    """What runs the trainer for the sweep file's command, here: this Python's ``-m posenc_lab.train`` (or ``-m
    posenc_lab.cli train`` for ``posenc-lab train``), whatever ``python`` or ``posenc-lab`` is first on PATH."""
    command = [str(c) for c in command]
    start = overrides_start(command)
    if start is None:  # load_sweep has refused such a command already
        raise SweepError(f"command {command} does not run posenc-lab's trainer; posenc-lab sweep runs nothing else")
    if command[start - 2 : start] == ["posenc-lab", "train"]:
        return [sys.executable, "-m", "posenc_lab.cli", "train"]
    return [sys.executable, "-m", ENTRY_MODULE]


def check_extra(sweep: Sweep, extra: list[str]) -> None:
    """SweepError for an extra override the runner cannot take: not an override, or a swept parameter."""
    if problem := grammar_problem("train", extra, "sweep"):  # a bare word, a bracket left open, a key Hydra cannot read
        raise SweepError(problem)
    swept = {name.lstrip("+~") for name in sweep.parameters}
    clash = [o for o in extra if override_key(o) in swept]
    if clash:
        raise SweepError(
            f"override {clash[0]!r} sets a swept parameter; the engine chooses it (edit the sweep file instead)"
        )


def launcher(overrides: list[str]) -> str | None:
    """The Hydra launcher chosen by ``hydra/launcher=NAME`` among the overrides (None: run locally)."""
    chosen = [o.split("=", 1)[1] for o in overrides if override_key(o) == LAUNCHER_GROUP]
    return chosen[-1] if chosen else None


def trial_overrides(sweep: Sweep, params: dict[str, Any], extra: list[str]) -> list[str]:
    """The trainer's overrides of one trial: the command's, the trial's parameters, then the extra ones."""
    swept = [format_override(k, v) for k, v in params.items()]
    return merge_overrides(sweep.before + swept + sweep.after, extra)


def runner_overrides(run_dir: Path, metric: str, history: Path, stop: Path, sweep_name: str) -> list[str]:
    """What the runner sets in every trial (``merge_overrides`` onto the command's): its run directory, also Hydra's
    output directory (a sweep file's relative ``hydra.run.dir`` would put the job's log under the working
    directory), and the SweepTrial callback."""
    cb = "+callbacks.sweep_trial"
    return [
        f"run_dir={hydra_value(str(run_dir))}",
        f"hydra.run.dir={hydra_value(str(run_dir))}",
        f"{cb}._target_=posenc_lab.sweeps.trial.SweepTrial",
        f"{cb}.metric={hydra_value(metric)}",
        f"{cb}.history={hydra_value(str(history))}",
        f"{cb}.stop={hydra_value(str(stop))}",
        f"{cb}.sweep={hydra_value(sweep_name)}",
        f"{cb}.logger=${{oc.select:logger._target_,null}}",
    ]


def launcher_overrides(run_dir: Path, launch_dir: Path) -> list[str]:
    """A trial as a one-job Hydra multirun through a launcher: the job's output directory is the run directory
    (an absolute subdir wins over the sweep dir); Hydra's multirun.yaml and submitit's logs go to launch_dir,
    so that the run directory holds nothing but the run."""
    return [
        f"hydra.sweep.dir={hydra_value(str(launch_dir))}",
        f"hydra.sweep.subdir={hydra_value(str(run_dir))}",
    ]


def trial_env(spec: dict[str, Any], sweep_id: str, run_id: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a trial: what wandb's agent sets (WANDB_SWEEP_ID, WANDB_RUN_ID, the project), and
    wandb offline unless WANDB_MODE says otherwise."""
    env = dict(os.environ if base is None else base)
    env.update(WANDB_SWEEP_ID=sweep_id, WANDB_RUN_ID=run_id)
    env.setdefault("WANDB_MODE", "offline")
    for key, var in (("project", "WANDB_PROJECT"), ("entity", "WANDB_ENTITY")):
        if spec.get(key):
            env.setdefault(var, str(spec[key]))
    return env
