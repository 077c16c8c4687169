"""An override Hydra's grammar cannot read (a bare word, a key it cannot read, a bracket or quote left open) is the
project's one line naming it and the nearest valid form, for every command that takes overrides, through the real
console script: never Hydra's parser error of five lines."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers_train import REPO, subprocess_env

FORMS = "KEY=VALUE, GROUP=OPTION, +KEY=VALUE, ++KEY=VALUE or ~KEY"
SWEEP = str(REPO / "sweeps" / "ablation_recall.yaml")

# (the command line after `posenc-lab`, the message after "error: ", a regular expression)
CASES = {
    "a bare word": (
        ["train", "rope"],
        rf"^rope is not an override \({re.escape(FORMS)}\); did you mean posenc=rope\?$",
    ),
    "a bare word near an option": (["train", "tinyy"], r"; did you mean experiment=tiny or model=tiny\?$"),
    "a key given no value": (["train", "model.mem_len"], r"; a key takes a value: model\.mem_len=VALUE$"),
    "a group given no option": (["train", "posenc"], r"; a group takes an option: posenc=OPTION, one of .*\brope\b"),
    "a non-ASCII key": (
        ["train", "model.mém_len=3"],
        r"^model\.mém_len=3: Hydra cannot read the key 'model\.mém_len'; 'mém_len' is not a key of model; the keys "
        r"are, the nearest first: mem_len, ",
    ),
    "an unbalanced bracket": (
        ["train", "model.adaptive_cutoffs=[8,16"],
        r"^model\.adaptive_cutoffs=\[8,16: a bracket or quote is not closed; did you mean "
        r"model\.adaptive_cutoffs=\[8,16\]\?$",
    ),
    "an unclosed quote": (["train", "run_dir='a b"], r"^run_dir='a b: .* not closed; did you mean run_dir='a b'\?$"),
    "among Hydra's flags": (["train", "--cfg", "job", "rope"], r"; did you mean posenc=rope\?$"),
    "in a multirun": (["train", "-m", "posenc=rope,xl", "rope"], r"; did you mean posenc=rope\?$"),
    "eval": (["eval", "ckpt=x.ckpt", "rope"], r"; did you mean posenc=rope\?$"),
    "ablate": (
        ["ablate", "ablate.schemes=[rope,xl"],
        r"^ablate\.schemes=\[rope,xl: a bracket or quote is not closed; did you mean ablate\.schemes=\[rope,xl\]\?$",
    ),
    "sweep": (["sweep", SWEEP, "model.mém_len=3"], r"'mém_len' is not a key of model; .* nearest first: mem_len, "),
    "bench": (["bench", "overhead", "rope"], r"; did you mean posenc=rope\?$"),
}


def console() -> list[str]:
    """The console script installed beside this Python, else the same entry point through python -m."""
    script = Path(sys.executable).parent / "posenc-lab"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "posenc_lab.cli"]


# a process start each (about 7 s on 2 cores): the default run takes one of each kind, `-m slow` every case
DEFAULT_RUN = ("a bare word", "an unbalanced bracket")  # each a CLI process, about 7 s: the rest with -m slow


@pytest.mark.parametrize("case", [c if c in DEFAULT_RUN else pytest.param(c, marks=pytest.mark.slow) for c in CASES])
def test_an_override_the_grammar_cannot_read_is_one_line_naming_the_nearest_valid_form(case, tmp_path):
    argv, message = CASES[case]
    command = " ".join(argv[:2]) if argv[0] == "bench" else argv[0]
    done = subprocess.run(
        [*console(), *argv], cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=300
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1, done.stderr[-3000:]
    prefix = f"posenc-lab {command}: error: "
    assert lines[0].startswith(prefix) and re.search(message, lines[0][len(prefix) :]), lines[0]
    assert not list(tmp_path.iterdir())  # nothing written where it ran (Hydra's outputs/, a run folder)
