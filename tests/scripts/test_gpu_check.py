"""scripts/gpu_check.sh: its header lists every stage it runs, in order, and its CPU dry-run line (in the header)
shrinks every stage sized for a GPU; the slow test runs that line and finds every stage run and passed."""

from __future__ import annotations

import itertools
import re
import shlex
import subprocess
import sys

import pytest

from tests.helpers_train import REPO, subprocess_env

SCRIPT = REPO / "scripts" / "gpu_check.sh"
TEXT = SCRIPT.read_text()
GPU_SIZED = re.compile(r"\b(base|small|cuda|gpu|bf16)")  # a default that only a GPU runs in the script's time


def header_stages() -> list[int]:
    lines = list(itertools.takewhile(lambda s: s.startswith("#"), TEXT.splitlines()[1:]))
    return [int(m.group(1)) for line in lines if (m := re.match(r"#\s(\d+)\.\s", line))]


def run_stages() -> list[int]:
    return [int(n) for n in re.findall(r'^stage "(\d+) ', TEXT, re.MULTILINE)]


def dry_run() -> tuple[dict[str, str], list[str]]:
    """(the variables the dry-run line sets, its command) from the header."""
    lines = TEXT.splitlines()
    start = end = next(i for i, line in enumerate(lines) if "A dry run of the script itself" in line) + 1
    while lines[end].rstrip().endswith("\\"):  # continued on the next line
        end += 1
    words = shlex.split(" ".join(lines[i].lstrip("#").strip().rstrip("\\") for i in range(start, end + 1)))
    env = dict(w.split("=", 1) for w in words if re.match(r"^[A-Z_]+=", w))
    return env, [w for w in words if not re.match(r"^[A-Z_]+=", w)]


def test_the_header_lists_every_stage_the_script_runs_in_order():
    assert run_stages() == header_stages() == list(range(1, len(run_stages()) + 1))
    titles = re.findall(r'^stage "\d+ ([^"(]*)', TEXT, re.MULTILINE)
    assert any(t.startswith("overhead") for t in titles)  # the overhead stage (`bench overhead`)
    assert any(t.startswith("compiled") for t in titles) and "--compile-mode reduce-overhead" in TEXT  # CUDA graphs
    assert "tests/test_compile.py -k cuda" in TEXT.replace("tests/test_fused.py ", "")  # every compiled model
    assert "posenc_lab.bench overhead" in TEXT


def test_the_dry_run_line_sets_what_the_script_reads_and_shrinks_every_gpu_sized_stage():
    env, command = dry_run()
    defaults = dict(re.findall(r"^([A-Z_]+)=\$\{\1:?-([^}]*)\}", TEXT, re.MULTILINE))
    emptied = {k for k, v in env.items() if not v}  # an empty value keeps the default under ${X:-...}: only ${X-...}
    assert not {k for k in emptied if f"${{{k}:-" in TEXT}, "an empty value in the dry run would keep the default"
    assert set(env) <= set(defaults), set(env) - set(defaults)  # no variable the script does not read
    gpu_sized = {k for k, v in defaults.items() if GPU_SIZED.search(v)}
    assert {"OVERHEAD_CONFIGS", "CONFIGS", "MODEL", "DEVICE", "TRAINER", "PRECISION"} <= gpu_sized
    assert gpu_sized <= set(env), f"the dry run keeps GPU sizes of {sorted(gpu_sized - set(env))}"
    assert command[:2] == ["bash", "scripts/gpu_check.sh"]


def test_stages_runs_the_stages_named_and_refuses_another(tmp_path):
    """STAGES=8 (the summary alone, as the last of several device calls): only stage 8 runs and logs; a number that is
    no stage is refused naming the valid ones, before anything is written."""
    env, command = dry_run()
    run = {"cwd": REPO, "capture_output": True, "text": True, "timeout": 300}
    out = tmp_path / "out"
    proc = subprocess.run([*command[:2], str(out)], env=subprocess_env(**env, STAGES="8", PYTHON=sys.executable), **run)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert re.findall(r"^== \S+ (\d+) ", (out / "stages.log").read_text(), re.MULTILINE) == ["8"]
    assert "not finished" in (out / "PERFORMANCE_gpu.md").read_text()  # no training stage ran
    bad = subprocess.run([*command[:2], str(tmp_path / "bad")], env=subprocess_env(**env, STAGES="1,9"), **run)
    assert bad.returncode == 2 and "STAGES=1,9: '9' is not a stage; valid: 1 to 8" in bad.stderr
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow  # every stage at tiny on 2 busy cores: about 12 minutes
def test_the_dry_run_runs_every_stage_and_each_exits_0(tmp_path):
    env, command = dry_run()
    limits = {k: "900" for k in re.findall(r"^(LIMIT_[A-Z]+)=", TEXT, re.MULTILINE)}  # a GPU's are too short here
    proc = subprocess.run(
        [*command[:2], str(tmp_path / "out")], cwd=REPO, env=subprocess_env(**env, **limits, PYTHON=sys.executable),
        capture_output=True, text=True, timeout=3000,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (tmp_path / "out" / "stages.log").read_text()
    assert [int(n) for n in re.findall(r"^== \S+ (\d+) ", log, re.MULTILINE)] == run_stages()
    exits = re.findall(r"exit (\d+)$", log, re.MULTILINE)
    assert exits and set(exits) == {"0"}, log
    summary = (tmp_path / "out" / "PERFORMANCE_gpu.md").read_text()
    assert "overhead of the training step" in summary and "overhead_ms" in summary
