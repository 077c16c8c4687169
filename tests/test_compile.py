"""``compile=true`` compiles the model (torch.compile), and the compiled model computes what the eager one does."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
from torch._dynamo.utils import counters

from posenc_lab.errors import ConfigError
from posenc_lab.memory import Recurrence
from posenc_lab.model import MemoryTransformer, ModelConfig
from posenc_lab.positional import SCHEME_NAMES, SCHEMES, schemes_of_kind, sized_options
from posenc_lab.train import train
from tests.helpers_train import REPO, compose_config, subprocess_env, tiny
from tests.schemes import HYBRID, HYBRID_OF_TWO


def test_compile_true_compiles_the_trained_model(monkeypatch, tmp_path, cache):
    compiled = []
    monkeypatch.setattr(MemoryTransformer, "compile", lambda self, *a, **k: compiled.append(self))
    train(compose_config("train", tiny(tmp_path / "eager", cache, steps=1)))
    assert compiled == []
    results = train(compose_config("train", tiny(tmp_path / "compiled", cache, "compile=true", steps=1)))
    assert len(compiled) == 1 and isinstance(compiled[0], MemoryTransformer) and results["steps"] == 1


def test_compiling_a_scheme_measured_slower_compiled_warns_with_the_measurement(monkeypatch, tmp_path, cache, caplog):
    monkeypatch.setattr(MemoryTransformer, "compile", lambda self, *a, **k: None)
    slower = [n for n in SCHEME_NAMES if SCHEMES[n].compile_slower]
    assert slower == ["path"]  # docs/PERFORMANCE.md: the only scheme slower compiled at every size
    with caplog.at_level("WARNING", logger="posenc_lab.train"):
        train(compose_config("train", tiny(tmp_path / "path", cache, "compile=true", "posenc=path", steps=1)))
    assert f"compile=true with posenc=path: {SCHEMES['path'].compile_slower}" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="posenc_lab.train"):
        train(compose_config("train", tiny(tmp_path / "xl", cache, "compile=true", steps=1)))
    assert "compile=true with posenc" not in caplog.text


def test_compile_must_be_a_bool(tmp_path, cache):
    with pytest.raises(ConfigError, match="compile must be true or false, got 'yes'"):
        train(compose_config("train", tiny(tmp_path / "run", cache, "compile=yes")))


COMPARE = """
import copy, sys, torch
from posenc_lab.memory import Recurrence
from posenc_lab.model import MemoryTransformer, ModelConfig
from posenc_lab.positional import sized_options
name, device = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "cpu"
tol = 1e-5 if device == "cpu" else 1e-4  # CUDA: inductor's kernels sum in other orders than eager's
torch.manual_seed(0)
eager = MemoryTransformer(ModelConfig(n_layer=1, d_model=16, n_head=2, d_inner=32, mem_len=8, dropout=0.0,
                                      posenc=name, posenc_kwargs=sized_options(name, {}, 8, 8))).to(device)
compiled = copy.deepcopy(eager)
compiled.compile()
tokens = torch.randint(256, (2, 2, 8), device=device)
results = []
for model in (eager, compiled):
    memory, total = Recurrence(), 0.0
    for seg in tokens.unbind(1):  # two segments through the static memory: empty, then with memory
        total = total + memory.step(model, seg, seg.roll(-1, 1)).loss
    results.append((total.detach(), torch.autograd.grad(total, list(model.parameters()), allow_unused=True)))
torch.testing.assert_close(results[1][0], results[0][0], atol=tol, rtol=tol)
for a, b in zip(results[1][1], results[0][1]):
    assert (a is None) == (b is None)
    if a is not None:
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)
print("compiled == eager", float(results[0][0]))
"""


# torch.compile of a 1-layer model: 2-5 min per scheme on 2 shared cores. In a fresh interpreter: inside this
# pytest process (torch 2.13 CPU inductor) the compiled backward crashed with a segmentation fault twice, while
# the same code in a bare interpreter passes; a crash then fails this test instead of ending the session.
# xl and shaw carry hand-written autograd functions (in-place adds through views), what torch.compile's
# functionalization is most likely to get wrong; fire, a parameter projected into its range (kerple and pope too:
# inductor's backward once read it after the graph wrote it); the absolute scheme stands for the SDPA path. Each run
# gets an inductor cache of its own: a cache left by an earlier run on this machine once made a correct graph fail.
@pytest.mark.slow
@pytest.mark.parametrize("name", ["xl", "shaw", "fire", schemes_of_kind("absolute")[-1]])
def test_compiled_model_equals_eager_loss_and_gradients(name, tmp_path):
    """Inductor: two segments (the first with an empty static memory), loss and every parameter's gradient."""
    _assert_compiled_equals_eager(name, "cpu", tmp_path, timeout=1500)


def _assert_compiled_equals_eager(name: str, device: str, tmp_path, timeout: int) -> None:
    """COMPARE for ``name`` on ``device`` in a fresh interpreter, with an inductor cache of its own."""
    done = subprocess.run(
        [sys.executable, "-c", COMPARE, name, device],
        cwd=REPO,
        env=subprocess_env(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor")),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0 and "compiled == eager" in done.stdout, done.stderr[-3000:]


# On a GPU (scripts/gpu_check.sh, stage 1): every scheme, inductor's CUDA kernels against eager. The mission's five
# first, so that a stage cut short by its time limit has judged them.
MISSION_FIRST = ["sinusoid", "learned", "global_sinusoid", "shaw", "xl"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: inductor's CUDA kernels (CPU: above)")
@pytest.mark.parametrize("name", MISSION_FIRST + [n for n in SCHEME_NAMES if n not in MISSION_FIRST])
def test_compiled_model_equals_eager_on_cuda(name, tmp_path):
    """As above, on CUDA, for every scheme."""
    _assert_compiled_equals_eager(name, "cuda", tmp_path, timeout=600)


# Every scheme, compiled with backend="aot_eager_decomp_partition": dynamo's tracing, AOTAutograd's forward and
# backward graphs with inductor's decompositions and its min-cut partitioner (which chooses what the backward saves
# and what it reads again), without inductor's code generation (seconds on a CPU, not minutes; inductor: the slow
# test above). Plain "aot_eager" saved other tensors and missed a failure inductor had (fire, kerple, pope: an
# in-place write into a parameter the backward read again). Graph breaks and recompilations are dynamo's, whatever
# the backend.
SEGMENTS, SEG_LEN, MEM = 4, 8, 16


def _segments(model, x):
    """Losses and gradients of every segment through Recurrence: an empty memory first, then a filling one."""
    memory, results = Recurrence(), []
    for t in range(SEGMENTS):
        seg = slice(t * SEG_LEN, (t + 1) * SEG_LEN)
        out = memory.step(model, x[:, seg], x[:, 1:][:, seg], reset=torch.tensor(t == 0), offset=torch.full((2,), t))
        params = [p for p in model.parameters() if p.requires_grad]
        results.append((out.loss.detach(), torch.autograd.grad(out.loss, params, allow_unused=True)))
        yield t, results[-1]


# Options that read the lengths on the device: rope's dynamic and longrope scalings (the span M + L), SSMax (the keys
# each query sees, a static memory's valid slots included). d_h = 8: longrope's factors are 4 numbers each.
LENGTH_READING = {
    "rope dynamic": ("rope", {"scaling": "dynamic", "factor": 2.0, "original_len": SEG_LEN}, {}),
    "rope longrope": (
        "rope",
        {
            "scaling": "longrope",
            "factor": 2.0,
            "original_len": SEG_LEN,
            "short_factor": [1.0, 1.0, 1.1, 1.2],
            "long_factor": [1.0, 1.5, 3.0, 8.0],
        },
        {},
    ),
    "alibi ssmax": ("alibi", {}, {"softmax_scale": "ssmax"}),
    "xl ssmax": ("xl", {}, {"softmax_scale": "ssmax"}),
    "cope ssmax": ("cope", {}, {"softmax_scale": "ssmax"}),
}


@pytest.mark.parametrize("variant", LENGTH_READING)
def test_length_reading_options_compile_without_graph_breaks_or_recompiles(variant):
    """From a static memory's empty start to a full one: one graph, as every scheme."""
    name, options, model = LENGTH_READING[variant]
    test_every_scheme_compiles_without_graph_breaks_or_recompiles(name, options, model)


# By default the mission's five and one scheme of each other way positions enter (each about 4 s); all with -m slow
_COMPILE_DEFAULT = set(MISSION_FIRST) | {"rope", "alibi", "fire", "cope", "path", HYBRID}


@pytest.mark.parametrize(
    "name", [n if n in _COMPILE_DEFAULT else pytest.param(n, marks=pytest.mark.slow) for n in SCHEME_NAMES]
)
def test_every_scheme_compiles_without_graph_breaks_or_recompiles(name, options=None, model=None):
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    options = sized_options(name, options or ({HYBRID: HYBRID_OF_TWO}.get(name) or {}), SEG_LEN, MEM)
    cfg = ModelConfig(
        vocab_size=32, n_layer=2, d_model=16, n_head=2, d_inner=32, mem_len=MEM, dropout=0.0, posenc=name,
        posenc_kwargs=options, **(model or {}),
    )  # fmt: skip
    eager = MemoryTransformer(cfg).train()
    compiled = copy.deepcopy(eager)
    compiled.compile(backend="aot_eager_decomp_partition")
    x = torch.randint(32, (2, SEGMENTS * SEG_LEN + 1))
    graphs = None
    for (t, (loss, grads)), (_, (loss_e, grads_e)) in zip(_segments(compiled, x), _segments(eager, x)):
        if t == 0:
            graphs = counters["stats"]["unique_graphs"]
        assert not counters["graph_break"], f"{name}: graph breaks {dict(counters['graph_break'])}"
        assert counters["stats"]["unique_graphs"] == graphs, f"{name}: recompiled at segment {t}"
        torch.testing.assert_close(loss, loss_e, atol=1e-5, rtol=1e-5)
        for a, b in zip(grads, grads_e):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert graphs == 1, f"{name}: {graphs} graphs for one segment shape"


def test_a_scheme_that_cannot_compile_is_refused_before_any_compute(monkeypatch, tmp_path, cache):
    monkeypatch.setattr(SCHEMES["xl"], "compile_refused", "its attention reads a table on the host")
    with pytest.raises(ConfigError, match=r"^compile=true cannot serve posenc=xl: its attention reads a table"):
        train(compose_config("train", tiny(tmp_path / "run", cache, "posenc=xl", "compile=true")))
    assert not (tmp_path / "run").exists()  # refused before anything was written
    assert [s for s in SCHEME_NAMES if SCHEMES[s].compile_refused and s != "xl"] == []  # every other one compiles


@pytest.mark.parametrize("name", [n for n in SCHEME_NAMES if SCHEMES[n].projected])
def test_projected_parameters_are_read_clamped_in_the_graph_and_written_outside_it(name):
    """A parameter an optimiser step pushed out of its range: the compiled forward reads it clamped, as the eager
    one, but writes nothing (inductor's backward reads the parameter again: a write fails its version check);
    ``at_step``, called by the training step before each forward, writes it back into range."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=32, n_layer=2, d_model=16, n_head=2, d_inner=32, mem_len=MEM, dropout=0.0, posenc=name,
        posenc_kwargs=sized_options(name, {HYBRID: HYBRID_OF_TWO}.get(name, {}), SEG_LEN, MEM),
    )  # fmt: skip
    eager = MemoryTransformer(cfg).train()
    compiled = copy.deepcopy(eager)
    compiled.compile(backend="aot_eager_decomp_partition")
    below = {p: low - 1.0 for p, (low, _) in eager.scheme.projected.items()}
    for model in (eager, compiled):
        with torch.no_grad():
            for p, value in below.items():
                getattr(model.scheme, p).fill_(value)
    x = torch.randint(32, (2, SEG_LEN + 1))
    losses = [Recurrence().step(model, x[:, :-1], x[:, 1:]).loss for model in (eager, compiled)]
    torch.testing.assert_close(losses[1], losses[0], atol=1e-5, rtol=1e-5)
    losses[1].backward()
    for p, (low, _) in eager.scheme.projected.items():
        assert (getattr(eager.scheme, p) == low).all()  # the eager forward wrote it
        assert (getattr(compiled.scheme, p) == below[p]).all()  # the compiled one did not
        assert getattr(compiled.scheme, p).grad.abs().sum() > 0  # the identity gradient, as PGD's
    compiled.at_step(0)
    for p, (low, _) in eager.scheme.projected.items():
        assert (getattr(compiled.scheme, p) == low).all()
