"""Check a wandb sweep file against the real Hydra config before any run starts.

``check_sweep(path)`` composes the config of every combination of the parameters (all grid points; for a
random or Bayesian search every categorical value and both ends of every range) with the one compose
(``posenc_lab.compose.Composer``) on ``conf/`` (the command's fixed overrides included, exactly as the
trial's command line), and validates what is cheap: config keys and config-group options, then every
trial with the one validator (``posenc_lab.checks.problems``), the Hydra launcher, and what only a sweep
needs: the metric is one LitLM logs and is optimised in the right direction, and the trial logs to wandb.
It returns the override list of every trial, or raises ``SweepError`` naming each bad key or value and
what would be valid. Nothing trains and no corpus is loaded.

    posenc-lab sweep-check sweeps/ablation.yaml            # check; list the trials
    posenc-lab sweep-check sweeps/ablation.yaml --multirun # the same grid as a Hydra multirun
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from ..checks import problems as config_problems
from ..compose import ADDABLE, CONF_DIR, Composer, unquoted
from ..data import ANSWER_CORPORA, CORPUS_UNITS
from ..errors import bounded, shown
from ..metrics import logged_metrics as lit_metrics
from ..metrics import renamed_figure
from .spec import Sweep, SweepError, format_override, format_problems, load_sweep, multirun_overrides, override_key


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
                    f"config key {shown(key)} does not exist: {here} has no {shown(part)}{hint}; "
                    f"keys there: {', '.join(valid)}"
                )
            node = node._get_node(part)
            node = node if isinstance(node, (DictConfig, ListConfig)) else None
        elif isinstance(node, ListConfig) and part.isdigit() and int(part) < len(node):
            node = node._get_node(int(part))
            node = node if isinstance(node, (DictConfig, ListConfig)) else None
        elif depth < len(parts):
            return f"config key {shown(key)} does not exist: {shown(here, quote=False)} is not a mapping"
    return None


def logged_metrics(cfg: DictConfig) -> set[str]:
    """The metric keys LitLM logs for this config (``posenc_lab.metrics.logged_metrics`` for its corpus's unit;
    a corpus unknown here gets every figure and the recall metrics)."""
    data = str(cfg.data.name)
    unit = CORPUS_UNITS.get(data)
    return lit_metrics(unit, data in ANSWER_CORPORA or unit is None, [int(e) for e in cfg.metrics.distance_buckets])


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def sweep_problems(cfg: DictConfig, metric: dict[str, Any] | None, require_wandb: bool = True) -> list[str]:
    """What only a sweep trial needs beyond a valid config: wandb as its logger, a metric LitLM logs."""
    problems: list[str] = []
    if require_wandb:
        target = str(OmegaConf.select(cfg, "logger._target_", default="") or "")
        if not target.endswith("WandbLogger"):
            problems.append(
                f"logger: the sweep's metric reaches wandb only through logger=wandb (got "
                f"{target or 'no logger'}); add logger=wandb to the command"
            )
    if metric:
        names = logged_metrics(cfg)
        unit = CORPUS_UNITS.get(str(cfg.data.name))
        mname = metric.get("name")
        renamed = renamed_figure(str(mname), unit)
        if mname not in names and renamed:
            problems.append(f"metric.name: {renamed}")
        elif mname not in names:
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
                f"metric.name={shown(mname)} is never logged for data={cfg.data.name}"
                + (f" (did you mean {close[0]!r}?)" if close else "")
                + f"; LitLM logs: {listed}"
            )
        goal = metric.get("goal", "minimize")
        leaf = str(mname).rsplit("/", 1)[-1]
        want = "maximize" if leaf.startswith("acc") or leaf == "tokens_per_s" else "minimize"
        if leaf in ("loss", "bpb", "bpc", "ppl") or leaf.startswith("acc") or leaf == "tokens_per_s":
            if goal != want:
                problems.append(
                    f"metric.goal={shown(goal, quote=False)} for {shown(mname, quote=False)}: "
                    f"that metric should be {want}d"
                )
    return problems


def validate_config(cfg: DictConfig, metric: dict[str, Any] | None = None, require_wandb: bool = True) -> list[str]:
    """Problems with a composed training config of a sweep trial: the one validator's, then the sweep's own."""
    return config_problems(cfg, "sweep") + sweep_problems(cfg, metric, require_wandb)


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
                    f"hydra.launcher.{key}={shown(v)}: SLURM needs an integer (hydra/launcher=slurm takes it "
                    f"from trainer.devices and trainer.num_nodes: set those to integers, e.g. "
                    f"trainer.devices=8 trainer.num_nodes=1)"
                )
    return problems


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
            except Exception as e:  # noqa: BLE001 - Hydra's grammar errors; a value that needs quotes: the hint train gives
                problems.append(_grammar_problem(composer, src, line, e))
                continue
            if parsed.is_sweep_override():
                problems.append(
                    f"{src} {shown(line)} is a multirun sweep (a comma or range in the value); "
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
                            f"{src} {shown(line)}: {shown(v)} is not an option of config group {group!r}"
                            + (f" (did you mean {close[0]!r}?)" if close else "")
                            + f"; options: {', '.join(options)}"
                        )
        if problems:
            raise SweepError(format_problems(sweep.path, problems))

        # 2. Every trial composes (as hydra.compose of its command line), every key exists, every value is valid.
        failures: dict[str, list[list[str]]] = {}
        for trial in trials:
            assignment = [o for o in trial if o not in sweep.fixed]
            parsed = [composer.parse(o) for o in trial]
            try:
                raw = composer.groups_config([p.input_line for p in parsed if composer.is_group(p)])
                for p in parsed:
                    if composer.is_group(p) or p.is_force_add() or p.is_delete():
                        continue
                    if p.is_add() and p.key_or_group.split(".")[0] in ADDABLE["train"]:
                        continue  # its owner checks it (compose.ADDABLE)
                    msg = _missing_key_message(raw, p.key_or_group)
                    if msg:
                        src = (
                            f"command override {shown(p.input_line)}"
                            if p.input_line in sweep.fixed
                            else f"parameter {shown(p.key_or_group)}"
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
        raise SweepError(format_problems(sweep.path, problems))
    return trials


def _blame(message: str, assignments: list[list[str]], sweep: Sweep, n_trials: int) -> str:
    """Which parameter value(s) a problem comes from: those shared by every trial that has it."""
    if message.startswith("parameter "):
        return ""
    common = set(assignments[0]).intersection(*map(set, assignments[1:]))
    swept = {o for o in common if len(sweep.parameters.get(override_key(o), [])) > 1}
    if swept:
        named = ", ".join(shown(o, quote=False) for o in sorted(swept))
        return f"  [from parameter {named}; {len(assignments)} of {n_trials} trial(s)]"
    if len(assignments) == n_trials:
        return "  [every trial]"
    example = " ".join(shown(o, quote=False) for o in assignments[0])
    return f"  [{len(assignments)} of {n_trials} trial(s), e.g. {example}]"


def _grammar_problem(composer: Composer, src: str, line: str, e: Exception) -> str:
    """A line Hydra's grammar cannot read: for a value it reads once quoted, the quoting hint of the command line
    (compose.unquoted: the same reason) with the string to write in the sweep file; else Hydra's own message."""
    found = unquoted(composer, line)
    if found is None:
        return f"{src} {shown(line)} is not a valid Hydra override: {_first_line(e)}"
    reason, quoted = found
    text = quoted if src == "command override" else quoted.partition("=")[2]  # a parameter's value, or the line
    written = shown(json.dumps(text, ensure_ascii=False), quote=False)  # a JSON string is a YAML string
    where = "the command's item" if src == "command override" else "the value"
    return f"{src} {shown(line)}: {reason}; quote it for Hydra, inside the YAML string: write {where} as {written}"


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return shown(" ".join(" ".join(text.splitlines()[:3]).split()), quote=False)  # Hydra pads its caret line


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
            print(f"FAIL {bounded(str(e))}", file=sys.stderr)
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
