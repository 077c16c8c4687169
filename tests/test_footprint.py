"""Sizes bounded before compute (posenc_lab/footprint.py): the estimate against built models and a measured step, and
sizes that would need terabytes refused in one line, before anything is built or written, by every command."""

from __future__ import annotations

import resource
import shutil
import subprocess
import sys

import pytest
import torch

from posenc_lab import footprint
from posenc_lab.checks import problems
from posenc_lab.footprint import Shape, activations, model_parameters, scheme_parameters
from posenc_lab.model import MemoryTransformer, ModelConfig
from posenc_lab.positional import sized_options
from tests.helpers_train import CORPUS, REPO, compose_config, subprocess_env, tiny

LIMIT = 3 << 30  # address space of a refused command: a regression fails fast instead of eating the machine


@pytest.mark.parametrize(
    "fields",
    [
        {"posenc": "xl"},
        {"posenc": "learned", "tie_weights": False, "output_bias": True},
        {"posenc": "rope", "pre_norm": False, "softmax_scale": "ssmax"},
        {"posenc": "shaw", "vocab_size": 1000, "adaptive_cutoffs": [100, 400], "output_bias": True},
        {"posenc": "path", "vocab_size": 1000, "adaptive_cutoffs": [300], "tie_weights": False},
        {"posenc": "hybrid", "n_layer": 4},
    ],
    ids=lambda f: f["posenc"],
)
def test_the_parameter_count_is_the_built_models(fields):
    fields = {"n_layer": 3, "d_model": 48, "n_head": 4, "d_inner": 80, "mem_len": 16, **fields}
    options = sized_options(fields["posenc"], {}, segment_len=32, mem_len=16)
    cfg = ModelConfig(**fields, posenc_kwargs=options)
    built = MemoryTransformer(cfg)
    assert scheme_parameters(cfg) == sum(p.numel() for p in built.scheme.parameters())
    assert model_parameters(cfg) + scheme_parameters(cfg) == built.num_params()


_MEASURE = """
import sys, torch
from posenc_lab.model import MemoryTransformer, ModelConfig
torch.manual_seed(0)
cfg = ModelConfig(n_layer=2, d_model=64, n_head=8, d_inner=256, mem_len=256, posenc=sys.argv[1])
model, B, L = MemoryTransformer(cfg), 8, 256
opt = torch.optim.AdamW(model.parameters())
tokens = torch.randint(0, 256, (B, L))
mems = [torch.randn(B, cfg.mem_len, cfg.d_model) for _ in range(cfg.n_layer)]
before = int(open("/proc/self/statm").read().split()[1]) * 4096
model(tokens, tokens, mems=mems).loss.backward()
opt.step()
peak = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(int(peak.split()[1]) * 1024 - before)
"""


@pytest.mark.parametrize("scheme", ["xl", "t5", "rope"])
def test_the_activations_bound_a_measured_training_step_within_an_order_of_magnitude(scheme):
    """The peak resident memory a training step (forward, backward, AdamW) adds, in a fresh process, is below the
    estimate of its activations, and within a factor 10 of it."""
    # The peak is the child's own address space's (VmHWM): ru_maxrss keeps, across exec, the parent's peak, which
    # is the whole test session's. glibc's own malloc: a test before this one may have run the CLI in this process,
    # whose keep_freed_memory() leaves MALLOC_MMAP_MAX_=0 in the environment (every transient block then stays in
    # the peak).
    env = {k: v for k, v in subprocess_env().items() if not k.startswith("MALLOC_")}
    run = subprocess.run([sys.executable, "-c", _MEASURE, scheme], env=env, capture_output=True, text=True, timeout=120)
    measured = int(run.stdout.split()[-1])
    cfg = ModelConfig(n_layer=2, d_model=64, n_head=8, d_inner=256, mem_len=256, posenc=scheme)
    estimate = activations(cfg, Shape(8, 256, 256), train=True)
    assert measured < estimate < 10 * measured, (measured, estimate)


def test_a_size_is_refused_only_past_what_the_machine_has_naming_the_option_that_can_fit(monkeypatch):
    """The tiny preset passes; with the RAM it needs taken away it is refused; a memory of 10**8 slots is refused
    naming model.mem_len (and no option that could not make it fit alone), randomized positions drawn from 10**11
    naming model.random_positions; a CPU run never initialises CUDA."""
    cfg = compose_config("train", ["experiment=tiny", "run_dir=unused"])
    assert problems(cfg) == []
    assert not torch.cuda.is_initialized()
    monkeypatch.setattr(footprint, "available_ram", lambda: 1000)
    (line,) = problems(cfg)
    assert "this run needs about" in line and "the CPU has 1.0 KB of RAM available" in line
    monkeypatch.setattr(footprint, "available_ram", lambda: 10**10)
    (line,) = problems(compose_config("train", ["experiment=tiny", "run_dir=unused", "model.mem_len=100000000"]))
    assert line.endswith("lower model.mem_len=100000000"), line
    assert "memory 819.2 GB" in line  # 100,000,000 slots x (2 x 8 training + 2 x 8 evaluation streams) x 2 x 32 x 4
    drawn = ["experiment=tiny", "run_dir=unused", "posenc=rope", "+model.random_positions=100000000000"]
    (line,) = problems(compose_config("train", drawn))  # a permutation of [0, P) each forward: 800 GB
    assert line.endswith("lower model.random_positions=100000000000"), line


def _refused(argv: list[str], cwd, marker: str = "error:") -> list[str]:
    """The error of ``posenc-lab ARGV`` run under a 3 GB address space: its one line with ``marker`` and the problems
    it lists (ablate and sweep-check name each on a line of its own); asserts it failed without a traceback."""
    run = subprocess.run(
        [sys.executable, "-m", "posenc_lab.cli", *argv],
        cwd=cwd,
        env=subprocess_env(HYDRA_FULL_ERROR="0"),
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT)),
    )
    lines = run.stderr.splitlines()
    errors = [i for i, line in enumerate(lines) if marker in line]
    assert run.returncode in (1, 2) and len(errors) == 1 and "Traceback" not in run.stderr, run.stderr[-3000:]
    return [line for line in lines[errors[0] :] if "HYDRA_FULL_ERROR" not in line]


@pytest.mark.parametrize(
    "override, option",
    [  # each a process of 10-40 s: the one that ate the machine runs by default, the others with -m slow
        ("model.n_layer=10000000", "model.n_layer=10000000"),
        pytest.param("model.mem_len=100000000", "model.mem_len=100000000", marks=pytest.mark.slow),
        pytest.param("model.d_model=1000000000", "model.d_model=1000000000", marks=pytest.mark.slow),
        pytest.param("data.batch_size=1000000000", "data.batch_size=1000000000", marks=pytest.mark.slow),
    ],
)
def test_train_refuses_terabytes_in_one_line_before_anything_is_written(tmp_path, cache, override, option):
    run_dir = tmp_path / "run"
    (line,) = _refused(["train", *tiny(run_dir, cache, override)], tmp_path)
    assert " TB of memory" in line or " PB of memory" in line or " EB of memory" in line, line
    assert "RAM available" in line and f"lower {option}" in line, line
    assert list(tmp_path.iterdir()) == []  # no run folder, run.json, config.yaml, hparams.yaml or train.log


@pytest.mark.parametrize(
    "override, option",
    [
        ("model.mem_len=100000000", "model.mem_len=100000000"),
        pytest.param("data.batch_size=1000000000", "data.batch_size", marks=pytest.mark.slow),
    ],
)
def test_eval_refuses_terabytes_in_one_line_before_the_model_is_built(tmp_path, finished, override, option):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    (line,) = _refused(["eval", f"ckpt={run / 'checkpoints' / 'last.ckpt'}", override], tmp_path)
    assert "this evaluation needs about" in line and option in line, line
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


@pytest.mark.slow
def test_ablate_sweep_and_bench_refuse_terabytes_in_one_line_before_anything_is_written(tmp_path, cache):
    out = tmp_path / "ablation"
    data = [f"data.root={cache}", *CORPUS["pystdlib"]]
    head, *runs = _refused(
        ["ablate", "experiment=tiny", f"ablate.out={out}", "model.mem_len=100000000", *data], tmp_path
    )
    assert head.endswith("the grid's runs have problems:") and runs, head
    assert all("needs about" in line and line.endswith("lower model.mem_len=100000000") for line in runs), runs
    assert list(tmp_path.iterdir()) == []
    sweep = tmp_path / "big.yaml"
    text = (REPO / "sweeps" / "shaw_k.yaml").read_text()
    sweep.write_text(text.replace("values: [0, 32, 64, 128]", "values: [0, 100000000]"))
    head, problem = _refused(["sweep-check", str(sweep)], tmp_path, marker="FAIL ")
    assert head.startswith("FAIL") and "lower model.mem_len=100000000  [from parameter model.mem_len" in problem, (
        problem
    )
    sweep.unlink()
    (line,) = _refused(["bench", "--configs", "tiny", "--schemes", "xl", "--model-set", "n_layer=10000000"], tmp_path)
    assert "this point needs about" in line and "lower --model-set n_layer=10000000" in line, line
    assert list(tmp_path.iterdir()) == []


def test_compare_refuses_streams_that_cannot_fit_before_any_run_is_loaded(finished):
    from posenc_lab_analysis.compare import size_problem
    from posenc_lab_analysis.dumps import AsTrained
    from posenc_lab_analysis.runs import load_run

    run = load_run(finished)
    assert size_problem([run], AsTrained(8, 64)) is None
    line = size_problem([run], AsTrained(10**9, 64))
    assert line.startswith(f"evaluating {finished} needs about") and "lower --n-streams=1000000000" in line, line


def test_a_gpu_trainer_is_judged_by_the_gpus_free_memory_and_never_by_a_gpu_it_lacks(monkeypatch):
    """trainer.accelerator=gpu: the line names what cuda:N has free (torch.cuda.mem_get_info of the first of
    trainer.devices); on a machine without CUDA nothing is judged here (the trainer names the missing GPU)."""
    overrides = ["experiment=tiny", "run_dir=unused", "trainer=gpu", "trainer.devices=[1]", "data.batch_size=4096"]
    cfg = compose_config("train", overrides)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert problems(cfg) == []
    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: asked.append(i) or (10**8, 80 * 10**9))
    monkeypatch.setattr(footprint, "available_ram", lambda: 10**15)  # the RAM is not what a GPU run is judged by
    (line,) = problems(cfg)
    assert asked and set(asked) == {1} and "but cuda:1 has 100.0 MB free: lower data.batch_size=4096" in line, line
