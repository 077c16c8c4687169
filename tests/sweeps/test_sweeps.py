"""Sweeps and clusters: wandb sweep files checked against conf/ before any run, one sweep trial end
to end with wandb offline, a Hydra multirun read by the report, the SLURM launcher config, and
Lightning's SLURM environment with two simulated srun tasks."""

from __future__ import annotations

import json
import math
import os
import re
import resource
import socket
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from posenc_lab.compose import Composer
from posenc_lab.defaults import group_options
from posenc_lab.positional import schemes_of_kind
from posenc_lab.sweeps import (
    SweepError,
    check_sweep,
    format_override,
    load_sweep,
    multirun_overrides,
    validate_launcher,
)
from posenc_lab.sweeps.command import command_prefix
from posenc_lab.sweeps.engine import engine_config
from posenc_lab.sweeps.spec import TRAIN_COMMANDS
from tests.schemes import SHAW, SINUSOID, XL
from tests.sweeps.helpers import REPO, SWEEPS, sweep_env, sweep_file, wandb_run_summary

with warnings.catch_warnings():  # sweeps 0.2 declares pydantic v1-style models: v2 warns on import, harmlessly
    warnings.simplefilter("ignore")
    from sweeps.config import schema as wandb_schema
    from sweeps.config import schema_violations_from_proposed_config

# A few-second training run: small recall corpus, short segments, few steps (later overrides win).
TINY = [
    "data.corpus.train_tokens=20000",
    "data.corpus.eval_tokens=3000",
    "data.corpus.max_distance=40",
    "data.segment_len=16",
    "data.batch_size=4",
    "trainer.max_steps=4",
    "trainer.val_check_interval=2",
    "trainer.limit_val_batches=2",
    "trainer.num_sanity_val_steps=0",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "trainer.log_every_n_steps=1",
    "final_eval.limit_batches=2",
    "optim.warmup_steps=2",
]


# ---- every sweep file ----------------------------------------------------------------------------


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_a_sweep_file_is_what_its_comment_says(path):
    """The grid size its opening comment states ("5 x 4 = 20 runs") is its grid's, the commands it shows name the
    file itself, and its name (wandb's job type) is its own."""
    sweep = load_sweep(path)
    comment = "\n".join(line for line in path.read_text().splitlines() if line.startswith("#"))
    if sweep.method == "grid":
        factors, total = re.search(r"(\d+(?: x \d+)+) = (\d+) runs", comment).groups()
        assert [int(f) for f in factors.split(" x ")] == [len(v) for v in sweep.parameters.values()]
        assert int(total) == math.prod(len(v) for v in sweep.parameters.values())
    shown = set(re.findall(r"sweeps/\w+\.yaml", comment))
    assert shown == {f"sweeps/{path.name}"}, shown
    names = [yaml.safe_load(p.read_text())["name"] for p in SWEEPS]
    assert names.count(sweep.spec["name"]) == 1


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_every_combination_composes(path):
    sweep = load_sweep(path)
    trials = check_sweep(path)
    if sweep.method == "grid":  # every grid point is checked
        assert len(trials) == math.prod(len(v) for v in sweep.parameters.values())
    for trial in trials:
        assert trial[: len(sweep.before)] == sweep.before and trial[len(trial) - len(sweep.after) :] == sweep.after
    # the metric is one the training logs, the runs log to wandb, each in its own run dir
    assert sweep.metric["name"].split("/")[0] in ("val", "test")
    assert "logger=wandb" in sweep.fixed
    assert any(o.startswith("hydra.run.dir=") and "WANDB_RUN_ID" in o for o in sweep.fixed)


def test_grids_cover_what_the_issue_asks():
    ablation = load_sweep(REPO / "sweeps" / "ablation.yaml")
    schemes = set(ablation.parameters["posenc"])  # the issue's five: every absolute scheme, shaw and xl
    assert schemes >= set(schemes_of_kind("absolute")) | {SHAW, XL}
    assert len(ablation.parameters["model.mem_len"]) >= 2 and 0 in ablation.parameters["model.mem_len"]
    bayes = load_sweep(REPO / "sweeps" / "bayes_xl.yaml")
    assert bayes.method == "bayes" and "posenc=xl" in bayes.fixed
    assert {"optim.lr", "optim.warmup_steps", "model.dropout", "posenc.clamp_len"} <= set(bayes.parameters)
    shaw = load_sweep(REPO / "sweeps" / "shaw_k.yaml")
    assert "posenc=shaw" in shaw.fixed and {"posenc.K", "model.mem_len"} <= set(shaw.parameters)


def test_checked_configs_equal_hydra_compose():
    """check_sweep composes once per group choice and sets each trial's own values with OmegaConf; the
    result equals hydra.compose of the trial's whole override list. No private Hydra module is used."""
    import posenc_lab.compose
    import posenc_lab.sweeps.check

    path = REPO / "sweeps" / "ablation.yaml"
    fast: list = []
    check_sweep(path, configs=fast)
    with Composer() as composer:
        for trial, cfg in [fast[0], fast[7], fast[-1]]:
            full = OmegaConf.to_container(composer.compose(trial), resolve=False)
            fast = OmegaConf.to_container(cfg, resolve=False)
            hydra_full, hydra_fast = full.pop("hydra"), fast.pop("hydra")
            assert hydra_full["run"]["dir"] == "runs/sweeps/${oc.env:WANDB_SWEEP_ID}/${oc.env:WANDB_RUN_ID}"
            assert fast == full, trial
            # the hydra node differs only in its record of the overrides (the trial's own values are set later)
            for node in (hydra_fast, hydra_full):
                del node["overrides"], node["job"]["override_dirname"]
            assert hydra_fast == hydra_full
    for module in (posenc_lab.compose, posenc_lab.sweeps.check):
        assert "_internal" not in Path(module.__file__).read_text()


# ---- bad sweeps are rejected before any run ----------------------------------------------------


def test_bad_key_is_rejected(tmp_path):
    path = sweep_file(tmp_path, "ablation.yaml", parameters={"model.men_len": {"values": [0, 128]}})
    with pytest.raises(SweepError) as e:
        check_sweep(path)
    msg = str(e.value)
    assert "model.men_len" in msg and "did you mean 'model.mem_len'" in msg and "keys there:" in msg
    assert "nothing was run" in msg and not (tmp_path / "runs").exists()


def test_an_added_key_that_nothing_reads_is_rejected(tmp_path):
    """+KEY in the command only where its owner checks it (compose.ADDABLE), as on the command line: +optim.lrr
    would train unread. (A parameter's name cannot start with +: wandb's schema refuses it.)"""
    command = yaml.safe_load((REPO / "sweeps" / "ablation.yaml").read_text())["command"]
    path = sweep_file(tmp_path, "ablation.yaml", command=[*command, "+optim.lrr=0.1"])
    with pytest.raises(
        SweepError,
        match=r"command override '\+optim\.lrr=0\.1': config key 'optim\.lrr' does not exist: optim has no 'lrr' "
        r"\(did you mean 'optim\.lr'",
    ):
        check_sweep(path)


def test_bad_scheme_option_key_is_rejected(tmp_path):
    path = sweep_file(tmp_path, "shaw_k.yaml", parameters={"posenc.clamp_len": {"values": [16]}})
    with pytest.raises(SweepError, match=r"posenc \(with posenc=shaw\) has no 'clamp_len'; keys there: K, name"):
        check_sweep(path)


def test_bad_value_is_rejected(tmp_path):
    path = sweep_file(
        tmp_path, "shaw_k.yaml", parameters={"posenc.K": {"values": [4, 0]}, "model.mem_len": {"values": [0, 32]}}
    )
    with pytest.raises(SweepError) as e:
        check_sweep(path)
    msg = str(e.value)
    assert "K must be an integer >= 1, got 0" in msg and "from parameter posenc.K=0" in msg
    assert "posenc.K=4" not in msg


def test_bad_group_option_is_rejected(tmp_path):
    path = sweep_file(tmp_path, "ablation.yaml", parameters={"posenc": {"values": [XL, XL + "l"]}})
    with pytest.raises(
        SweepError,
        match=rf"'{XL}l' is not an option of config group 'posenc' "
        rf"\(did you mean '{XL}'\?\); options: {', '.join(group_options('posenc'))}",  # the schemes and presets
    ):
        check_sweep(path)


@pytest.mark.parametrize(
    "params, expected",
    [
        ({"model.mem_len": {"values": [32, "long"]}}, "model.mem_len must be an integer >= 0, got 'long'"),
        ({"posenc.K": {"values": [4, None]}}, 'write the string "null" instead'),
        ({"model.dropout": {"values": [0.1, 1.5]}}, "model.dropout must be in [0, 1), got 1.5"),
        ({"optim.lr": {"distribution": "uniform", "min": -1.0, "max": 1.0e-3}}, "optim.lr must be a number > 0"),
        (
            {"trainer.precision": {"values": ["32-true", "bf17-mixed"]}},  # the valid ones come from Lightning
            "trainer.precision='bf17-mixed' is not a Lightning precision; valid: ",
        ),
    ],
)
def test_bad_values_name_key_and_reason(tmp_path, params, expected):
    path = sweep_file(tmp_path, "shaw_k.yaml", parameters=params, method="bayes")
    with pytest.raises(SweepError) as e:
        check_sweep(path)
    assert expected in str(e.value)


def test_metric_and_command_are_checked(tmp_path):
    path = sweep_file(tmp_path, "shaw_k.yaml", metric={"name": "val/bpb", "goal": "minimize"})
    with pytest.raises(SweepError, match=r"'val/bpb' is never logged for data=recall \(did you mean 'val/ppl'\?\)"):
        check_sweep(path)
    for base, figure in (("ablation.yaml", "val/bpb"), ("shaw_k.yaml", "val/ppl")):  # the old name: the new one
        path = sweep_file(tmp_path, base, metric={"name": "val/bpt", "goal": "minimize"})
        with pytest.raises(SweepError, match=rf"metric\.name: val/bpt is no longer logged: its name is now {figure} "):
            check_sweep(path)
    path = sweep_file(tmp_path, "shaw_k.yaml", metric={"name": "val/acc", "goal": "minimize"})
    with pytest.raises(SweepError, match="should be maximized"):
        check_sweep(path)
    path = sweep_file(tmp_path, "ablation.yaml", command=["${env}", "python", "${program}", "${args}"])
    with pytest.raises(SweepError, match=r"use \$\{args_no_hyphens\}"):
        load_sweep(path)
    spec = yaml.safe_load((REPO / "sweeps" / "ablation.yaml").read_text())
    path = sweep_file(tmp_path, "ablation.yaml", command=[c for c in spec["command"] if not c.startswith("logger")])
    with pytest.raises(SweepError, match="add logger=wandb"):
        check_sweep(path)
    path = sweep_file(tmp_path, "ablation.yaml", command=spec["command"] + ["model.mem_len=64"])
    with pytest.raises(SweepError, match="also fixed in the command"):
        load_sweep(path)


# One bad thing a case in a bayes sweep file, and the one line it gets. wandb's sweep schema (the `sweeps` package)
# judges the fields and types of method, metric and each parameter; posenc-lab adds what its runs need.
SCHEMA_CASES = {
    # a distribution's field of the wrong type: the hand-written checks passed it (the agent would pass mu as text)
    "field type": (
        {"parameters": {"model.dropout": {"distribution": "normal", "mu": "0.1"}}},
        "parameter 'model.dropout': mu: '0.1' is not of type 'number'",
    ),
    "field of another form": (
        {"parameters": {"model.dropout": {"min": 0.0, "max": 0.3, "step": 0.1}}},
        "parameter 'model.dropout': Additional properties are not allowed ('step' was unexpected); uniform takes min, "
        "max, distribution",
    ),
    "integer bounds": (
        {"parameters": {"optim.warmup_steps": {"distribution": "int_uniform", "min": 0, "max": 10.5}}},
        "parameter 'optim.warmup_steps': max: 10.5 is not of type 'integer'",
    ),
    "min not below max": (
        {"parameters": {"model.dropout": {"min": 0.1, "max": 0.1}}},
        "parameter 'model.dropout': min 0.1 is not less than max 0.1",
    ),
    "log range from 0": (
        {"parameters": {"optim.lr": {"distribution": "log_uniform_values", "min": 0.0, "max": 1.0e-3}}},
        "parameter 'optim.lr': min: 0.0 is less than or equal to the minimum of 0.0",
    ),
    "deprecated distribution": (
        {"parameters": {"optim.lr": {"distribution": "log_uniform", "min": -9.0, "max": -6.0}}},
        "parameter 'optim.lr': uses log_uniform, where min/max specify base-e exponents. Use log_uniform_values to "
        "specify limit values.",
    ),
    "probabilities": (
        {"parameters": {"posenc.clamp_len": {"values": [16, 32], "probabilities": [0.5, 0.6]}}},
        "parameter 'posenc.clamp_len': Probabilities [0.5, 0.6] do not sum to 1",
    ),
    "no values": (
        {"parameters": {"posenc.clamp_len": {"values": []}}},
        "parameter 'posenc.clamp_len': values: [] should be non-empty",
    ),
    "no form": (
        {"parameters": {"model.dropout": {"mu": 0.1}}},
        "parameter 'model.dropout': {'mu': 0.1} is none of wandb's parameter forms: {values}, {values, probabilities}, "
        "{min, max}, {value}, or a distribution (beta, categorical, ",
    ),
    "+ in a name": (
        {"parameters": {"+optim.lrr": {"values": [0.1]}}},
        "parameter '+optim.lrr': '+optim.lrr' does not match '^^[A-Za-z_][A-Za-z0-9_.-]*$' (wandb's rule for a "
        "parameter's name); Hydra's +key, ~key and group/option overrides go in the command (fixed), not in parameters",
    ),
    "method": ({"method": "bayesian"}, "method: 'bayesian' is not one of ['bayes', 'random', 'grid', 'custom']"),
    "metric goal": (
        {"metric": {"name": "val/bpb", "goal": "lower"}},
        "metric.goal: 'lower' is not one of ['minimize', 'maximize']",
    ),
    "metric field": (
        {"metric": {"name": "val/bpb", "goal": "minimize", "mode": "min"}},
        "metric: Additional properties are not allowed ('mode' was unexpected)",
    ),
    # posenc-lab's own, beyond the schema
    "custom method": (
        {"method": "custom"},
        "method: 'custom' leaves proposing trials to a controller of your own; posenc-lab sweep runs wandb's engine, "
        "whose methods are grid, random, bayes",
    ),
    "nested": (
        {"parameters": {"optim": {"parameters": {"lr": {"values": [0.1]}}}}},
        "parameter 'optim': nested parameters are not supported (the agent would pass a dict); write each leaf as a "
        "dotted key, e.g. optim.lr",
    ),
    "null": (
        {"parameters": {"posenc.clamp_len": {"value": None}}},
        "parameter 'posenc.clamp_len': a YAML null reaches Hydra as the text 'None' (wandb writes "
        'posenc.clamp_len=None); write the string "null" instead',
    ),
    "grid range": (
        {"method": "grid"},
        "parameter 'optim.lr': method grid needs a list of values (or one value), not a distribution",
    ),
}


@pytest.mark.parametrize("changes, line", SCHEMA_CASES.values(), ids=SCHEMA_CASES)
def test_a_bad_structure_is_named_by_wandbs_schema_or_posenc_labs_own_rule(tmp_path, changes, line):
    path = sweep_file(tmp_path, "bayes_xl.yaml", **changes)
    with pytest.raises(SweepError) as e:
        load_sweep(path)
    lines = [x[4:] for x in str(e.value).splitlines() if x.startswith("  - ")]
    assert any(x.startswith(line) for x in lines), lines
    if changes.get("method") != "grid":  # one bad thing, one line (the grid case has three ranges)
        assert len(lines) == 1, lines


def test_an_unknown_distribution_is_named_with_the_schemas_own():
    """The distributions listed are those of wandb's schema, less the ones its checks refuse as deprecated."""
    from posenc_lab.sweeps.spec import _explain

    (line,) = _explain({"distribution": "loguniform", "min": 1.0e-4, "max": 1.0e-2})
    head, names = line.split("; wandb's distributions: ")
    assert head == "unknown distribution 'loguniform'"
    names = names.split(", ")
    schema = Path(wandb_schema.sweep_config_jsonschema_fname).read_text()
    in_schema = set(re.findall(r'"distribution": \{\s*"enum": \[\s*"(\w+)"', schema))
    assert len(in_schema) == 18 and set(names) == in_schema - {"log_uniform", "inv_log_uniform", "q_log_uniform"}
    assert names == sorted(names) and "log_uniform_values" in names and "beta" in names


# Parameters as a sweep file may write them, good and bad (none that posenc-lab refuses on its own).
PARAMETER_FORMS = [
    {"values": [0.1, 0.2]},
    {"values": [0.1, 0.2], "probabilities": [0.25, 0.75]},
    {"values": [0.1, 0.2], "probabilities": [0.5]},
    {"value": 0.1},
    {"value": 0.1, "values": [0.2]},
    {"min": 0, "max": 1},
    {"min": 0.0, "max": 0.3},
    {"min": 0.3, "max": 0.0},
    {"min": True, "max": False},
    {"distribution": "uniform", "min": 0, "max": 1},
    {"distribution": "int_uniform", "min": 0.0, "max": 1.0},
    {"distribution": "q_uniform", "min": 0.0, "max": 0.3, "q": 0.1},
    {"distribution": "q_uniform", "min": 0.0, "max": 0.3, "q": 0},
    {"distribution": "log_uniform_values", "min": 1.0e-4, "max": 1.0e-2},
    {"distribution": "log_uniform", "min": -9.0, "max": -4.0},
    {"distribution": "normal"},
    {"distribution": "normal", "mu": 0.1, "sigma": -1},
    {"distribution": "normal", "min": 0.0, "max": 0.3},
    {"distribution": "log_normal", "mu": -3},
    {"distribution": "beta", "a": 2, "b": 5},
    {"distribution": "beta", "a": "2"},
    {"distribution": "gamma", "a": 2},
    {"mu": 0.1},
    {},
]


@pytest.mark.parametrize("form", PARAMETER_FORMS, ids=lambda f: json.dumps(f))
def test_load_sweep_refuses_a_parameter_exactly_when_wandbs_own_check_does(tmp_path, form):
    """schema_violations_from_proposed_config is wandb's verdict on a sweep config (what its engine checks before
    it proposes); load_sweep agrees with it on each parameter."""
    spec = yaml.safe_load((REPO / "sweeps" / "bayes_xl.yaml").read_text())
    spec["parameters"] = {"model.dropout": form}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wandb_refuses = bool(schema_violations_from_proposed_config(engine_config(spec)))
    path = sweep_file(tmp_path, "bayes_xl.yaml", parameters=spec["parameters"])
    try:
        load_sweep(path)
    except SweepError as e:
        assert wandb_refuses, str(e)
    else:
        assert not wandb_refuses


def test_the_values_checked_are_each_forms_own(tmp_path):
    """A list: each value; a range: its ends as written (integers for int_uniform); a distribution without ends:
    its median as wandb's engine computes it, with the schema's defaults (mu 0)."""
    forms = {
        "a.values": ({"values": [16, "null"]}, [16, "null"]),
        "a.value": ({"value": 3}, [3]),
        "a.ints": ({"min": 0, "max": 1000}, [0, 1000]),
        "a.reals": ({"min": 0, "max": 0.3}, [0.0, 0.3]),
        "a.log": ({"distribution": "log_uniform_values", "min": 1.0e-4, "max": 3.0e-3}, [1.0e-4, 3.0e-3]),
        "a.normal": ({"distribution": "normal", "mu": 0.1, "sigma": 0.01}, [0.1]),
        "a.standard": ({"distribution": "normal"}, [0.0]),
        "a.lognormal": ({"distribution": "log_normal", "mu": -3}, [math.exp(-3)]),
        "a.beta": ({"distribution": "beta", "a": 3, "b": 3}, [pytest.approx(0.5)]),
    }
    path = sweep_file(tmp_path, "bayes_xl.yaml", parameters={k: form for k, (form, _) in forms.items()})
    sweep = load_sweep(path)
    assert sweep.parameters == {k: values for k, (_, values) in forms.items()}
    assert [type(v) for v in sweep.parameters["a.ints"] + sweep.parameters["a.reals"]] == [int, int, float, float]
    assert all(type(v) is float for v in sweep.parameters["a.lognormal"] + sweep.parameters["a.beta"])


# The probe's way in: a command that runs a program of its own, then the trainer.
MARKER_COMMAND = ["bash", "-c", 'touch MARKER; exec "$0" "$@"', "posenc-lab", "train", "${args_no_hyphens}"]
RECALL_COMMAND = yaml.safe_load((REPO / "sweeps" / "ablation_recall.yaml").read_text())["command"]
RECALL_FIXED = RECALL_COMMAND[RECALL_COMMAND.index("${args_no_hyphens}") + 1 :]


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"command": MARKER_COMMAND + RECALL_FIXED}, "command ['bash', '-c', 'touch MARKER; exec"),
        ({"command": ["/tmp/elsewhere/posenc-lab", "train", "${args_no_hyphens}", *RECALL_FIXED]}, "/tmp/elsewhere"),
        ({"command": ["${env}", "python", "-c", "import os", "-m", "posenc_lab.train", "${args_no_hyphens}"]},
         "'-c', 'import os'"),
        ({"command": ["${env}", "${interpreter}", "${program}", "${args_no_hyphens}"]}, "${program}"),
        ({"program": "posenc_lab/train.py"}, "program: 'posenc_lab/train.py'"),
        ({"command": RECALL_COMMAND + ["+callbacks.x._target_=subprocess.Popen"]}, "callbacks.x._target_"),
        ({"command": RECALL_COMMAND + ["+callbacks.x=${oc.decode:'{a: 1}'}"]}, "(oc.decode)"),
        ({"command": RECALL_COMMAND + ["hydra.job.env_set.LD_PRELOAD=/tmp/x.so"]}, "hydra.job.env_set"),
        ({"command": RECALL_COMMAND + ["--config-dir=/tmp"]}, "'--config-dir=/tmp' is a flag"),
        ({"parameters": {"callbacks.y._target_": {"values": ["subprocess.Popen"]}}}, "parameter 'callbacks.y._target"),
    ],
    ids=["marker", "another posenc-lab", "python -c", "program macro", "program", "target", "decode", "hydra",
         "flag", "target parameter"],
)  # fmt: skip
def test_a_sweep_file_runs_only_posenc_labs_trainer(tmp_path, monkeypatch, capsys, changes, named):
    """Any other command, program or code is refused by sweep-check (and by `posenc-lab sweep`, which reads the
    file the same way: tests/sweeps/test_run.py), naming it and wandb agent as the way to run other programs."""
    from posenc_lab import sweeps

    monkeypatch.chdir(tmp_path)
    path = sweep_file(tmp_path, "ablation_recall.yaml", **changes)
    assert sweeps.main([str(path)]) == 1
    out, err = capsys.readouterr()
    assert named in err and "nothing was run" in err and "wandb agent" in err, err
    assert not out and not (tmp_path / "MARKER").exists()


@pytest.mark.parametrize("trainer", TRAIN_COMMANDS, ids=" ".join)
def test_every_form_of_the_trainer_runs_this_pythons_posenc_lab(tmp_path, trainer):
    """The forms wandb's agent accepts for posenc-lab's trainer all pass; the runner runs each with this Python's
    posenc_lab, not whatever python or posenc-lab is first on PATH."""
    path = sweep_file(tmp_path, "ablation_recall.yaml", command=[*trainer, "${args_no_hyphens}", *RECALL_FIXED])
    sweep = load_sweep(path)
    assert sweep.after == RECALL_FIXED and sweep.before == []
    console = trainer[-2:] == ("posenc-lab", "train")
    assert command_prefix(sweep.spec["command"]) == [
        sys.executable,
        "-m",
        *(["posenc_lab.cli", "train"] if console else ["posenc_lab.train"]),
    ]


def test_cli_reports_bad_sweep(tmp_path):
    bad = sweep_file(tmp_path, "ablation.yaml", parameters={"model.men_len": {"values": [0]}})
    good = REPO / "sweeps" / "shaw_k.yaml"
    from posenc_lab import sweeps

    assert sweeps.main([str(good), "--multirun"]) == 0
    assert sweeps.main([str(bad)]) == 1
    # `posenc-lab sweep-check` and `posenc-lab sweep` are the command line's own (posenc_lab.cli), no entry point
    from posenc_lab import cli
    from posenc_lab.sweeps import run

    assert cli.COMMANDS["sweep-check"][0]() is sweeps.main and cli.COMMANDS["sweep"][0]() is run.main


# ---- what a sweep file may expand to, and what its error lines echo ---------------------------------------

# The probe's files: 1 KB each. Nine nested aliases under one parameter's values expand to 9**9 values (sweep-check
# printed nothing for 120 s, `posenc-lab sweep` grew to 2.0 GB in 62 s); merge keys (<<) double a mapping's pairs
# at every level before the dict drops the repeats.
_HEAD = ["method: grid", "metric: {name: val/acc, goal: maximize}", "parameters:"]
_TAIL = ['command: [posenc-lab, train, "${args_no_hyphens}", data=recall, model=tiny, logger=wandb]']
_ALIASES = "abcdefghi"
BOMBS = {
    "aliases": [
        *_HEAD, "  seed:", "    values:", "      - &a [x, x, x, x, x, x, x, x, x]",
        *(f"      - &{n} [{', '.join([f'*{p}'] * 9)}]" for p, n in zip(_ALIASES, _ALIASES[1:])), *_TAIL,
    ],
    "merge keys": [
        "base: &m0 {a: 1, b: 2, c: 3, d: 4}",
        *(f"l{i}: &m{i} {{<<: [{', '.join([f'*m{i - 1}'] * 8)}]}}" for i in range(1, 12)),
        *_HEAD, "  seed:", "    values: [0, 1]", *_TAIL,
    ],
}  # fmt: skip
MEMORY_BOUND = 2 << 30  # bytes of data a sweep check may take here: a regression fails at once, not the machine


def _bounded_memory() -> None:  # runs in the child before exec
    resource.setrlimit(resource.RLIMIT_DATA, (MEMORY_BOUND, MEMORY_BOUND))


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize(
    "bomb, command",
    # one case by default (each is a CLI process under a memory limit, about 10 s); the others with -m slow
    [
        ("aliases", "sweep-check"),
        pytest.param("aliases", "sweep", marks=pytest.mark.slow),
        pytest.param("merge keys", "sweep-check", marks=pytest.mark.slow),
    ],
)
def test_a_sweep_file_that_expands_past_the_bound_is_one_line_before_it_expands(tmp_path, bomb, command):
    """Each command refuses the file in one line, naming where it expands and the bound, in well under the timeout
    and the memory bound, and writes nothing (``posenc-lab sweep``: no --out folder)."""
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(BOMBS[bomb]) + "\n")
    assert path.stat().st_size < 1024
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "posenc_lab.cli", command, str(path), *(["--out", str(out)] * (command == "sweep"))]
    before = _snapshot(tmp_path)
    proc = subprocess.run(
        argv,
        cwd=tmp_path,
        env=sweep_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=240,
        preexec_fn=_bounded_memory,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == (1 if command == "sweep-check" else 2) and len(lines) == 1, proc.stderr[-3000:]
    where = "parameters.seed.values" if bomb == "aliases" else "l11.<<"  # the key that holds most of it
    found = re.search(
        rf"{re.escape(str(path))}: {re.escape(where)} expands to ([\d,]+) YAML nodes \(every alias \*NAME repeats all "
        r"that its anchor holds\); a sweep file may expand to 100,000: write the values out, with fewer aliases$",
        lines[0],
    )
    assert found and int(found[1].replace(",", "")) > (9**9 if bomb == "aliases" else 8**11), lines[0]
    assert not proc.stdout and _snapshot(tmp_path) == before and not out.exists()


@pytest.mark.parametrize(
    "text, message",
    [
        ("values: &a [0, *a]", "the list or mapping at line 5 holds an alias of itself, which never ends"),
        ("values: [" + ", ".join(map(str, range(1001))) + "]",
         "parameter 'seed': 1001 values, more than the 1000 a parameter may have; split it"),
        ("values: [" + ", ".join(map(str, range(100))) + "]\n  model.mem_len:\n    values: ["
         + ", ".join(map(str, range(60))) + "]",
         "parameters: 6000 trials to check (seed: 100 x model.mem_len: 60), more than the 5000 a sweep file may have"),
        ("values: [0, 1", "not valid YAML at line 6, column 8: expected ',' or ']', but got ':' (while parsing a "
         "flow sequence from line 5)"),
    ],
    ids=["an alias in itself", "1001 values", "6000 trials", "invalid YAML"],
)  # fmt: skip
def test_what_a_sweep_file_may_hold_is_bounded_and_named(tmp_path, capsys, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text("\n".join([*_HEAD, "  seed:", f"    {text}", *_TAIL]) + "\n")
    from posenc_lab import sweeps

    assert sweeps.main([str(path)]) == 1
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) <= 2, err[-3000:]


def _one_parameter(tmp_path: Path, key: str, values: list) -> Path:
    path = tmp_path / "sweep.yaml"
    spec = yaml.safe_load("\n".join([*_HEAD, "  x: {}", *_TAIL]))
    spec["parameters"] = {key: {"values": values}}
    path.write_text(yaml.safe_dump(spec, allow_unicode=True, sort_keys=False))
    return path


@pytest.mark.parametrize("value", ["grüße", "naïve (v2)"])
def test_a_value_that_needs_quotes_gets_trains_hint_and_the_value_it_gives_passes(tmp_path, capsys, value):
    """The same reason and quoted form as `posenc-lab train` gives (compose.unquoted), not Hydra's lexer exception
    padded with spaces; written into the file as the line says, the value passes and reaches the trainer."""
    from posenc_lab import sweeps
    from posenc_lab.compose import override_problem

    path = _one_parameter(tmp_path, "logger.group", [value])
    assert sweeps.main([str(path)]) == 1
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("  - ")]
    trains = override_problem("train", [f"logger.group={value}"], "train")
    reason = trains.split(": ", 1)[1].split("; quote it", 1)[0]
    assert line.startswith(f"  - parameter 'logger.group={value}': {reason}; quote it for Hydra, inside the YAML ")
    assert "LexerNoViableAltException" not in line and "  " not in line[4:]
    written = line.rsplit("write the value as ", 1)[1]
    path = _one_parameter(tmp_path, "logger.group", [yaml.safe_load(written)])
    configs: list = []
    check_sweep(path, configs=configs)
    assert configs[0][1].logger.group == value


@pytest.mark.slow  # sweep-check composes a 200,000-character value: about 11 s
def test_a_200000_character_value_is_echoed_cut_with_its_length(tmp_path, capsys):
    """sweep-check and `posenc-lab sweep` echoed it twice (a 400 KB line); each echo is now its head and length."""
    from posenc_lab import sweeps
    from posenc_lab.sweeps.run import main as sweep_main

    path = _one_parameter(tmp_path, "model.mem_len", ["a" * 200_000, 16])
    assert sweeps.main([str(path)]) == 1
    err = capsys.readouterr().err
    assert f"model.mem_len must be an integer >= 0, got '{'a' * 200}...' (200000 chars)" in err
    assert max(map(len, err.splitlines())) < 1000, max(map(len, err.splitlines()))
    assert sweep_main([str(path), "--out", str(tmp_path / "out")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "(200000 chars)" in line and len(line) < 1000 and not (tmp_path / "out").exists()
    path = _one_parameter(tmp_path, "logger.group", ["é" * 200_000])  # Hydra's grammar refuses it: the hint
    assert sweeps.main([str(path)]) == 1
    err = capsys.readouterr().err
    assert "cannot read the character(s) 'é'" in err and max(map(len, err.splitlines())) < 1000


def test_corpus_units_match_the_corpora(tmp_path):
    """The checker knows each corpus's unit (bpb, bpc or ppl) without loading it; check the cheap ones."""
    from posenc_lab.data import CORPUS_NAMES, CORPUS_UNITS, load_corpus

    assert set(CORPUS_UNITS) == set(CORPUS_NAMES)
    text = tmp_path / "text.txt"
    text.write_text("hello world, " * 2000)
    assert load_corpus("textfile", root=tmp_path, path=str(text)).unit == CORPUS_UNITS["textfile"]
    assert load_corpus("recall", root=tmp_path, train_tokens=5000, eval_tokens=1000).unit == CORPUS_UNITS["recall"]


def test_multirun_overrides_of_a_grid():
    args = multirun_overrides(REPO / "sweeps" / "ablation.yaml")
    assert "posenc=xl,shaw,sinusoid,learned,global_sinusoid" in args and "model.mem_len=0,64,128,256" in args
    assert not any(a.startswith(("logger", "hydra.run.dir")) for a in args)
    with pytest.raises(SweepError, match="samples ranges"):
        multirun_overrides(REPO / "sweeps" / "bayes_xl.yaml")


# ---- one sweep trial end to end, wandb offline ---------------------------------------------------


def agent_command(path: Path, assignment: dict, python: str = sys.executable) -> list[str]:
    """The command wandb's agent runs for one trial (wandb/wandb_agent.py, _command_run)."""
    from wandb.sdk.launch.sweeps.utils import create_sweep_command, create_sweep_command_args

    spec = yaml.safe_load(path.read_text())
    sweep_vars = create_sweep_command_args({"args": {k: {"value": v} for k, v in assignment.items()}})
    sweep_vars.update(interpreter=[python], env=["/usr/bin/env"])
    command = []
    for c in create_sweep_command(list(spec["command"])):
        if c.startswith("${") and c.endswith("}"):
            command += sweep_vars[c[2:-1]]
        else:
            command.append(python if c == "python" else c)
    return command


def test_sweep_trial_runs_end_to_end_with_wandb_offline(tmp_path):
    path = REPO / "sweeps" / "ablation_recall.yaml"
    trials = check_sweep(path)  # first the check, as before a real sweep
    assignment = {"posenc": XL, "model.mem_len": 32}
    command = agent_command(path, assignment)
    assert [format_override(k, v) for k, v in assignment.items()] == command[command.index("posenc_lab.train") + 1 :][
        :2
    ]
    assert command[command.index("posenc_lab.train") + 1 :] in trials
    env = sweep_env(
        tmp_path,
        WANDB_MODE="offline",
        WANDB_DIR=str(tmp_path / "wandb"),
        WANDB_SILENT="true",
        WANDB_SWEEP_ID="sweeptest",
        WANDB_RUN_ID="trial0001",
    )
    proc = subprocess.run(command + TINY, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "runs" / "sweeps" / "sweeptest" / "trial0001"
    results = json.loads((run_dir / "results.json").read_text())
    assert results["scheme"] == XL and results["mem_len"] == 32 and results["steps"] == 4
    info = wandb_run_summary(run_dir)
    assert info["run_id"] == "trial0001"
    # named and grouped by posenc_lab.tracking: the cell, the seed, the sweep (its id: wandb's agent gives no name)
    assert info["name"] == f"recall/{XL}:mem32 seed0 sweep-sweeptest/trial0001"
    assert info["group"] == f"sweep-sweeptest/recall/{XL}:mem32" and info["job_type"] == "ablation-recall"
    assert {"ablation-recall", XL, "mem32"} <= set(info["tags"])
    metric = yaml.safe_load(path.read_text())["metric"]["name"]
    assert metric in info["history"], sorted(info["history"])
    # the checker's list of logged keys covers everything the run logged (no false rejections)
    from posenc_lab.sweeps import logged_metrics

    with Composer() as composer:
        cfg = composer.compose(command[command.index("posenc_lab.train") + 1 :])
    logged = {k for k in info["history"] if "/" in k and not k.startswith("trainer/")}
    assert logged <= logged_metrics(cfg), logged - logged_metrics(cfg)
    # the resolved config (LitLM's hyper-parameters hold the whole run config)
    config = info["config"]["config"]
    assert config["model"]["mem_len"] == 32 and config["posenc"]["name"] == XL
    assert config["run_dir"] == str(run_dir.resolve()) and "${" not in json.dumps(config)


# ---- Hydra multirun, read by the report ---------------------------------------------------------


def test_two_job_multirun_and_report(tmp_path):
    sweep_dir = tmp_path / "multirun"
    cmd = [
        sys.executable,
        "-m",
        "posenc_lab.train",
        "-m",
        "posenc=xl,sinusoid",
        "data=recall",
        "model=tiny",
        "model.mem_len=16",
        *TINY,
        f"hydra.sweep.dir={sweep_dir}",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, env=sweep_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dirs = sorted(p for p in sweep_dir.iterdir() if p.is_dir())
    assert [p.name for p in run_dirs] == ["0_xl_recall", "1_sinusoid_recall"]
    for d in run_dirs:  # each job its own run dir
        assert (d / "results.json").is_file() and (d / "checkpoints" / "last.ckpt").is_file()
        assert json.loads((d / "results.json").read_text())["run_dir"] == str(d.resolve())

    from posenc_lab_analysis.report import main as report_main
    from posenc_lab_analysis.runs import find_runs

    assert [r.scheme for r in find_runs([sweep_dir])] == [SINUSOID, XL]
    out = tmp_path / "report"
    assert report_main([str(sweep_dir), "--out", str(out), "--no-speed"]) == 0
    text = (out / "report.md").read_text()
    assert f"0_{XL}_recall" in text or XL in text
    tables = list(out.rglob("*.csv"))
    assert tables, list(out.iterdir())
    rows = "".join(t.read_text() for t in tables)
    assert "0_xl_recall" in rows and "1_sinusoid_recall" in rows

    # the tables and figures go to wandb as Tables and Images (offline here; a child process, so
    # that wandb's service has written the run file when it exits)
    env = sweep_env(tmp_path, WANDB_MODE="offline", WANDB_DIR=str(tmp_path / "wandb"), WANDB_SILENT="true")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "analysis.wandb_upload",
            str(out),
            "--runs",
            str(sweep_dir),
            "--project",
            "posenc-lab-test",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_id = proc.stdout.split("as wandb run ")[-1].strip()
    info = wandb_run_summary(tmp_path / "wandb")
    assert info["run_id"] == run_id and info["job_type"] == "report" and info["group"] == "multirun"
    assert {XL, SINUSOID} <= set(info["tags"])
    kinds = {k: v[-1].get("_type") for k, v in info["history"].items() if isinstance(v[-1], dict)}
    assert kinds.get("tables/runs") == "table-file"
    assert any(k.startswith("figures/") and t == "image-file" for k, t in kinds.items()), kinds
    assert sum(t == "table-file" for t in kinds.values()) >= len(tables) + 1


# ---- clusters -------------------------------------------------------------------------------------


def _fake_slurm_bin(tmp_path: Path) -> Path:
    """srun/sbatch stand-ins so that submitit's SLURM executor can be built (nothing is submitted)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("srun", "sbatch", "sacct", "scancel"):
        f = bindir / name
        f.write_text("#!/bin/sh\necho 'no SLURM here' >&2\nexit 1\n")
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    return bindir


def test_slurm_launcher_config_composes(tmp_path, monkeypatch):
    pytest.importorskip(
        "hydra_plugins.hydra_submitit_launcher",
        reason="hydra-submitit-launcher is not installed (pip install 'posenc-lab[slurm]')",
    )
    import submitit
    from hydra.utils import instantiate
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher

    overrides = [
        "hydra/launcher=slurm",
        "trainer=ddp",
        "trainer.devices=8",
        "trainer.num_nodes=2",
        "hydra.launcher.partition=gpu",
        "hydra.sweep.dir=" + str(tmp_path / "sweep"),
    ]
    with Composer() as composer:
        cfg = composer.compose(overrides)
        assert validate_launcher(cfg) == []
        launcher_cfg = cfg.hydra.launcher
        assert (launcher_cfg.nodes, launcher_cfg.gpus_per_node, launcher_cfg.tasks_per_node) == (2, 8, 8)
        assert cfg.trainer.precision == "bf16-mixed" and cfg.trainer.strategy == "ddp"
        launcher = instantiate(launcher_cfg)
        assert isinstance(launcher, SlurmLauncher)
        # trainer.devices=auto cannot size an allocation: an error before submission
        auto = composer.compose(["hydra/launcher=slurm", "trainer=ddp"])
        assert any("trainer.devices" in p for p in validate_launcher(auto))
    # What the plugin hands to submitit (SlurmLauncher.launch) gives a valid sbatch script.
    monkeypatch.setenv("PATH", f"{_fake_slurm_bin(tmp_path)}{os.pathsep}{os.environ['PATH']}")
    params = dict(launcher.params)
    executor = submitit.AutoExecutor(
        cluster="slurm", folder=str(tmp_path / "submitit"), slurm_max_num_timeout=params.pop("max_num_timeout")
    )
    params.pop("submitit_folder")
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items()})
    script = executor._executor._make_submission_file_text("python -u -m submitit.core._submit", "uid")
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --ntasks-per-node=8",
        "#SBATCH --partition=gpu",
    ):
        assert line in script, script


def test_global_batch_is_split_per_rank(tmp_path):
    """data.batch_size is the global batch whatever the device count: rank r of W gets the streams
    [r B/W, (r+1) B/W) of the single-process batch."""
    import torch

    from posenc_lab.datamodule import SegmentDataModule

    dm = SegmentDataModule(
        name="recall",
        segment_len=16,
        batch_size=8,
        root=str(tmp_path),
        corpus={"train_tokens": 20000, "eval_tokens": 3000},
    )
    whole = next(iter(dm.make_stream("train", 0, 1)))["tokens"]
    for world in (2, 4, 8):
        parts = [next(iter(dm.make_stream("train", r, world)))["tokens"] for r in range(world)]
        assert all(p.shape[0] == 8 // world for p in parts)
        assert torch.equal(torch.cat(parts), whole)


@pytest.mark.slow  # two DDP processes: about 40 s on 2 busy cores
def test_lightning_slurm_environment_two_tasks(tmp_path):
    """Two processes started the way srun starts them (SLURM_* variables, no launcher of our own):
    Lightning's SLURMEnvironment takes rank and world size from them and the run trains as one
    two-rank DDP job with the global batch of a single-process run."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "posenc_lab.train",
        "trainer=ddp_cpu",
        "data=recall",
        "model=tiny",
        "model.mem_len=16",
        *TINY,
        f"hydra.run.dir={run_dir}",
    ]
    procs = []
    for rank in range(2):
        env = sweep_env(
            tmp_path,
            SLURM_NTASKS="2",
            SLURM_NTASKS_PER_NODE="2",
            SLURM_PROCID=str(rank),
            SLURM_LOCALID=str(rank),
            SLURM_NODEID="0",
            SLURM_NNODES="1",
            SLURM_JOB_ID="4242",
            SLURM_JOB_NAME="train",
            SLURM_NODELIST="localhost",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        procs.append(
            subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in outs[1]
    assert all("SLURM auto-requeueing enabled" in out for out in outs)  # SLURMEnvironment was detected
    results = json.loads((run_dir / "results.json").read_text())
    assert results["world_size"] == 2 and results["batch_size"] == 4 and results["steps"] == 4
