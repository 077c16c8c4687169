"""Installs that work anywhere. `import posenc_lab` changes nothing in the process (the command line sets
OMP_WAIT_POLICY); a wheel (`pip install .`, not editable) in a fresh virtual environment carries the
configs inside the package and the analysis code as `posenc_lab_analysis`, and `posenc-lab train`, `eval`
and `ablate` run from an unrelated directory with no checkout in sight."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import posenc_lab

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "setup.py", "README.md", "posenc_lab", "conf", "analysis")  # what a wheel needs
TINY = [
    "model=tiny",
    "data=recall",
    "data.corpus.train_tokens=20000",
    "data.corpus.eval_tokens=3000",
    "data.corpus.max_distance=40",
    "data.segment_len=16",
    "data.batch_size=4",
    "model.mem_len=16",
    "trainer.max_steps=2",
    "trainer.val_check_interval=1000",
    "trainer.limit_val_batches=2",
    "trainer.num_sanity_val_steps=0",
    "trainer.enable_progress_bar=false",
    "final_eval.limit_batches=2",
]


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without this checkout on the path, without OMP_WAIT_POLICY (conftest sets it) and
    without the malloc settings (a test that ran the command line in this process set them)."""
    dropped = ("PYTHONPATH", "OMP_WAIT_POLICY", "MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def python(code: str, *args: str, **env: str) -> str:
    """Run `python -c code args...` with the checkout importable; its stdout."""
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        env=clean_env(PYTHONPATH=str(REPO), **env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_importing_the_packages_changes_no_environment_variable():
    changed = python(
        "import os; before = dict(os.environ)\n"
        "import posenc_lab, posenc_lab.cli\n"
        "print(sorted(set(os.environ.items()) ^ set(before.items())))"
    )
    assert changed.strip() == "[]"


@pytest.mark.parametrize("preset, expected", [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_the_command_line_asks_for_passive_openmp_threads_unless_told_otherwise(preset, expected):
    code = (
        "import contextlib, io, os, posenc_lab.cli\n"
        "with contextlib.redirect_stdout(io.StringIO()): posenc_lab.cli.main(['--help'])\n"
        "print(os.environ.get('OMP_WAIT_POLICY'))"
    )
    assert python(code, **({"OMP_WAIT_POLICY": preset} if preset else {})).strip() == expected


# The minor page faults of 5 x (allocate and free 64 MiB), after 10 rounds of warm-up (the heap settles: a
# block freed below a newer small one is reused only later); torch only, no posenc_lab
FAULTS = (
    "import os, resource, torch\n"
    "for _ in range(10): torch.zeros(16 * 2**20)\n"
    "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
    "for _ in range(5): torch.zeros(16 * 2**20)\n"
    "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, os.environ.get('MALLOC_MMAP_MAX_'))"
)
# the command line's setup first, then FAULTS in this process or in a child process (which inherits only
# the environment, as `posenc-lab train` re-executed as python -m posenc_lab.train does)
AFTER_SETUP = (
    "import contextlib, io, subprocess, sys, posenc_lab.cli\n"
    "with contextlib.redirect_stdout(io.StringIO()): posenc_lab.cli.main(['--help'])\n"
    f"if sys.argv[1] == 'child': print(subprocess.run([sys.executable, '-c', {FAULTS!r}], capture_output=True, "
    "text=True, check=True).stdout)\n"
    f"else: exec({FAULTS!r})\n"
)


def _transparent_huge_pages() -> str:
    try:
        return Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return ""


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
    reason="keep_freed_memory tunes glibc's malloc: Linux with glibc only",
)
@pytest.mark.skipif(
    "[always]" in _transparent_huge_pages(),
    reason="transparent huge pages are 'always' here: a mapped 64 MiB block faults in 2 MiB at a time, too few "
    "faults to tell a kept block from a fresh one",
)
@pytest.mark.parametrize("where", ["process", "child"])
def test_the_command_line_keeps_freed_memory_instead_of_faulting_it_in_again(where):
    def run(**env: str) -> tuple[int, str]:
        faults, setting = python(AFTER_SETUP, where, **env).split()
        return int(faults), setting

    kept_faults, kept_setting = run()
    # the user's own malloc setting is kept: every 64 MiB block is a fresh mmap, 16k pages to fault in
    default_faults, default_setting = run(MALLOC_MMAP_MAX_="65536")
    # the opt-out leaves malloc as glibc sets it (over its 32 MiB ceiling every block is mapped afresh)
    untouched_faults, untouched_setting = run(POSENC_LAB_KEEP_FREED_MEMORY="0")
    assert (kept_setting, default_setting) == ("0", "65536")  # exported for the processes it starts; user's kept
    assert untouched_setting == "None"  # nothing set, nothing exported
    assert default_faults > 5 * 16384 * 0.9 and untouched_faults > 5 * 16384 * 0.9
    assert kept_faults < 5 * 16384 * 0.1


def test_config_dir_of_a_checkout_is_the_top_level_conf():
    assert Path(posenc_lab.config_dir()) == REPO / "conf"


# ---- the wheel, in a virtual environment of its own ----


def run(cmd: list, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        list(map(str, cmd)), cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(bin directory of a venv holding only the wheel of this checkout, an unrelated working directory).

    The sources are copied first so that the build writes nothing into the checkout. The dependencies
    come from the running environment through a .pth file (no download); `--ignore-installed` keeps pip
    from touching that environment's own (editable) posenc-lab.
    """
    root = tmp_path_factory.mktemp("install")
    src, venv, work = root / "src", root / "venv", root / "work"
    src.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(REPO / name, src / name)
    run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=root)
    venv_site = run(
        [venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=root
    ).stdout.strip()
    Path(venv_site, "_posenc_lab_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            venv / "bin" / "python",
            "install",
            "--no-deps",
            "--no-build-isolation",
            "--ignore-installed",
            "--no-index",
            "--quiet",
            src,
        ],
        cwd=root,
    )
    shutil.rmtree(src)  # nothing may read the sources after the install
    work.mkdir()
    return venv / "bin", work


@pytest.mark.slow
def test_the_wheel_holds_two_packages_and_the_configs(installed):
    bin_dir, work = installed
    code = (
        "import importlib.metadata as m, importlib.util, posenc_lab\n"
        "files = m.distribution('posenc-lab').files\n"
        "print(sorted({f.parts[0] for f in files if f.parts[0] != '..' and '.dist-info' not in f.parts[0]}))\n"
        "print(posenc_lab.config_dir())\n"
        "print(importlib.util.find_spec('analysis'))"
    )
    top_level, conf, analysis = run([bin_dir / "python", "-c", code], cwd=work).stdout.splitlines()
    assert top_level == "['posenc_lab', 'posenc_lab_analysis']"
    assert Path(conf).is_relative_to(bin_dir.parent) and Path(conf, "hydra", "launcher", "slurm.yaml").is_file()
    assert analysis == "None"  # the generic name stays free


@pytest.mark.slow
def test_train_eval_and_ablate_run_from_an_unrelated_directory(installed, tmp_path):
    bin_dir, work = installed
    cli = bin_dir / "posenc-lab"
    run([cli, "train", f"run_dir={tmp_path / 'run'}", f"data.root={tmp_path / 'cache'}", *TINY], cwd=work)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["steps"] == 2
    hydra_cfg = (tmp_path / "run" / ".hydra" / "hydra.yaml").read_text()
    assert str(bin_dir.parent) in hydra_cfg and str(REPO) not in hydra_cfg  # composed from the installed conf

    run(
        [
            cli,
            "eval",
            f"ckpt={tmp_path / 'run' / 'checkpoints' / 'last.ckpt'}",
            "max_batches=2",
            f"out_dir={tmp_path / 'eval'}",
            "progress_bar=false",
        ],
        cwd=work,
    )
    (evaluation,) = (tmp_path / "eval").glob("runs/run-*/eval/last/*.json")  # the run's mirror in out_dir
    assert json.loads(evaluation.read_text())["loss"] > 0

    assert "posenc-lab ablate" in run([cli, "ablate", "--help"], cwd=work).stdout
    out = tmp_path / "ablate"
    run(
        [
            cli,
            "ablate",
            "experiment=tiny",
            "ablate.schemes=[xl]",
            "ablate.recurrence=[true]",
            "ablate.half_loss.schemes=[]",
            "ablate.recall.schemes=[]",
            "trainer.max_steps=2",
            "data.corpus.max_bytes=100000",
            f"ablate.out={out}",
            f"data.root={tmp_path / 'cache'}",
        ],
        cwd=work,
    )
    with open(out / "report" / "table_ablation.csv") as f:
        rows = list(csv.DictReader(f))
    runs = [p.name for p in (out / "runs").iterdir()]
    assert len(runs) == 1 and runs[0].startswith("xl_mem16_full"), runs  # the one run asked for
    assert rows and {r["scheme"] for r in rows} == {"xl"} and (out / "report" / "report.md").is_file()
    assert not any(work.iterdir())  # every output went where it was told
