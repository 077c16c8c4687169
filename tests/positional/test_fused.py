"""The attention paths of xl, shaw, t5 and alibi against the naive per-pair references: the fused one
(flex_attention) and the unfused one (the schemes' own GEMMs, with xl's and shaw's hand-written backward).

torch refuses flex_attention's backward on CPU, so the fused path's gradients are checked through its uncompiled
reference implementation (``fused.REFERENCE``, torch's CPU refusal lifted for the test): the same
score_mods, block masks and Shaw correction that CUDA runs compiled. The compiled CPU forward (what
``attention_impl=fused`` runs for CPU evaluation) is checked in the slow tests."""

from __future__ import annotations

import csv
import math
import types
import warnings

import pytest
import torch
import torch.nn.attention.flex_attention as torch_flex

from posenc_lab import bench
from posenc_lab.model import MemoryTransformer, ModelConfig
from posenc_lab.positional import AttentionInputs, fused
from tests.positional.test_schemes import (
    MASKS,
    make_positions,
    make_scheme,
    masked_softmax,
    naive_scores,
    naive_shaw,
    naive_xl,
    qkv,
)
from tests.schemes import ALIBI, FIRE, FOX, KERPLE_LOG, KERPLE_POWER, SANDWICH, SHAW, SINUSOID, T5, XL

FUSED = (XL, SHAW, T5, ALIBI)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def reference(monkeypatch):
    """flex_attention uncompiled, with its backward allowed on CPU."""
    monkeypatch.setattr(fused, "REFERENCE", True)
    monkeypatch.setattr(torch_flex, "_validate_device", lambda q, k, v: None)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        yield


def naive_attend(name, scheme, layer, q, k, v, pos):
    if name == XL:
        return naive_xl(scheme, layer, q, k, v, pos)[1]
    if name == SHAW:
        return naive_shaw(scheme, layer, q, k, v, pos)[1]
    return masked_softmax(naive_scores(name, scheme, q, k, pos), pos.visible) @ v


def grads(out, inputs):
    weight = torch.linspace(-1.0, 1.0, out.numel()).view_as(out)  # every output element counts differently
    return torch.autograd.grad((out * weight).sum(), inputs, allow_unused=True)


def assert_attend_equals_naive(name, scheme, q, k, v, pos, leaves):
    """scheme.attend against the per-pair loops: the output, and the gradient of q, k, v's ``leaves`` (what
    q, k, v were made from) and of every scheme parameter."""
    inputs = [*leaves, *scheme.parameters()]
    out = scheme.attend(AttentionInputs(1, q, k, pos, v=v))
    want = naive_attend(name, scheme, 1, q, k, v, pos)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    names = ["q", "k", "v", *dict(scheme.named_parameters())]
    for got, ref, what in zip(grads(out, inputs), grads(want, inputs), names):
        if ref is None:
            assert got is None or not got.any(), what
        else:
            torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5, msg=lambda m, what=what: f"grad of {what}: {m}")


@pytest.mark.parametrize("L, M, same_length", MASKS)
@pytest.mark.parametrize("name", FUSED)
@pytest.mark.parametrize("impl", ["fused", "unfused"])
def test_both_paths_equal_naive_forward_and_backward(reference, impl, name, L, M, same_length):
    """Each attention path, forward and gradients (unfused: the hand-written backward of xl's shifted
    (b)+(d) and Shaw's near diagonals, against the per-pair loops)."""
    scheme = make_scheme(name).train()
    scheme.attention_impl = impl
    q, k, v = (x.requires_grad_() for x in qkv(L, M))
    assert_attend_equals_naive(name, scheme, q, k, v, make_positions(L, M, same_length), [q, k, v])


KEYLESS = [(1, 0, False), (1, 4, False), (5, 0, False), (5, 3, True), (4, 9, False)]


@pytest.mark.parametrize("L, M, same_length", KEYLESS)
@pytest.mark.parametrize("name, options", [(SHAW, {"K": 1}), (SHAW, {"K": 16}), (XL, {})])
def test_unfused_gradients_with_strided_inputs_and_keyless_near_distances(name, options, L, M, same_length):
    """q, k, v as the model hands them (transposed views of [B, L, H, d_h]); Shaw with K = 16 >= N, where
    queries have no key at some near distances (M < K - 1), the rows the near-diagonal views handle apart."""
    scheme = make_scheme(name, **options).train()
    scheme.attention_impl = "unfused"
    bases = [x.transpose(1, 2).contiguous().requires_grad_() for x in qkv(L, M)]  # [B, L or N, H, d_h]
    q, k, v = (x.transpose(1, 2) for x in bases)
    assert_attend_equals_naive(name, scheme, q, k, v, make_positions(L, M, same_length), bases)


def test_fused_positional_tables_get_a_gradient(reference):
    """The captured tables (t5 bias, xl's (b)+(d), shaw a^K and a^V) are trained through the fused path."""
    L, M = 5, 3
    pos = make_positions(L, M)
    for name, param in [(T5, "bias"), (XL, "v"), (SHAW, "a_key"), (SHAW, "a_value")]:
        scheme = make_scheme(name).train()
        scheme.attention_impl = "fused"
        q, k, v = qkv(L, M)
        (g,) = grads(scheme.attend(AttentionInputs(1, q, k, pos, v=v)), [getattr(scheme, param)])
        assert g is not None and g.abs().sum() > 0, (name, param)


@pytest.mark.parametrize("name", FUSED)
def test_auto_keeps_the_unfused_path_on_cpu(monkeypatch, name):
    """CPU: no flex backward; for evaluation compiling per shape costs more than it saves."""
    monkeypatch.setattr(fused, "_flex", lambda: pytest.fail("flex_attention called"))
    scheme, pos = make_scheme(name).train(), make_positions(5, 3)
    q, k, v = (x.requires_grad_() for x in qkv(5, 3))
    assert scheme.attention_impl == "auto"
    out = scheme.attend(AttentionInputs(1, q, k, pos, v=v))
    out.sum().backward()
    assert q.grad is not None
    with torch.no_grad():
        torch.testing.assert_close(scheme.attend(AttentionInputs(1, q, k, pos, v=v)), out)


@pytest.mark.parametrize("name", FUSED)
def test_auto_on_cuda_takes_the_fused_path_from_the_schemes_measured_key_count(name):
    """auto on CUDA: fused from ``fused_from_keys`` keys on (None: never); forced paths ignore it."""
    scheme = make_scheme(name)
    on_cuda = types.SimpleNamespace(device=torch.device("cuda"))  # the rule reads only the device
    start = scheme.fused_from_keys
    for n_keys in (1, 256, 1023, 1024, 4096):
        k = torch.empty(1, 1, n_keys, 1)
        want = start is not None and n_keys >= start
        scheme.attention_impl = "auto"
        assert fused.use_fused(scheme, on_cuda, k, 0.0) is want, (name, n_keys)
        scheme.attention_impl = "fused"
        assert fused.use_fused(scheme, on_cuda, k, 0.0) is True
        scheme.attention_impl = "unfused"
        assert fused.use_fused(scheme, on_cuda, k, 0.0) is False
    scheme.attention_impl, scheme.fused_from_keys = "auto", 0
    assert fused.use_fused(scheme, on_cuda, torch.empty(1, 1, 4096, 1), 0.1) is False  # attention dropout: unfused


@pytest.mark.parametrize(
    "grad, name, dropout, match",
    [
        (True, XL, 0.0, "no backward on CPU"),
        (False, SHAW, 0.0, "no log-sum-exp"),
        (False, T5, 0.1, "no attention dropout"),
    ],
)
def test_forced_fused_names_why_it_cannot_run(grad, name, dropout, match):
    scheme, pos = make_scheme(name), make_positions(5, 3)
    scheme.attention_impl = "fused"
    q, k, v = qkv(5, 3)
    with torch.set_grad_enabled(grad), pytest.raises(RuntimeError, match=f"attention_impl=fused.*{match}"):
        scheme.attend(AttentionInputs(1, q.requires_grad_(grad), k, pos, v=v, dropout_p=dropout))


def test_model_rejects_an_unknown_attention_impl():
    with pytest.raises(ValueError, match="attention_impl must be one of auto, fused, unfused, got 'flash'"):
        ModelConfig(attention_impl="flash")


@pytest.mark.parametrize("name", FUSED)
def test_model_fused_equals_unfused_with_memory(reference, name):
    """The model passes model.attention_impl to the scheme: loss and gradients agree over two segments
    (the second with memory) and the same-length mask."""
    cfg = dict(
        n_layer=2,
        d_model=16,
        n_head=4,
        d_inner=32,
        mem_len=6,
        same_length=True,
        dropout=0.0,
        posenc=name,
        posenc_kwargs={"K": 2} if name == SHAW else {},
    )
    tokens = torch.randint(256, (2, 2, 5))
    results = []
    for impl in ("unfused", "fused"):
        torch.manual_seed(1)
        model = MemoryTransformer(ModelConfig(**cfg, attention_impl=impl))
        assert model.scheme.attention_impl == impl
        mems, losses = None, []
        for seg in tokens.unbind(1):
            out = model(seg, seg.roll(-1, 1), mems=mems)
            mems = out.mems
            losses.append(out.loss)
        total = sum(losses)
        results.append((total.detach(), torch.autograd.grad(total, list(model.parameters()))))
    torch.testing.assert_close(results[1][0], results[0][0], atol=1e-5, rtol=1e-5)
    for a, b in zip(results[1][1], results[0][1]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.slow  # compiles flex_attention for the CPU: 15-60 s per scheme on 2 shared cores
@pytest.mark.parametrize("name", [XL, T5, ALIBI])
def test_compiled_cpu_forward_equals_naive(name):
    """What attention_impl=fused runs in CPU evaluation: the compiled kernel, no gradient."""
    scheme, (L, M) = make_scheme(name), (5, 9)
    scheme.attention_impl = "fused"
    pos, (q, k, v) = make_positions(L, M, same_length=True), qkv(L, M)
    with torch.no_grad():
        torch.testing.assert_close(
            scheme.attend(AttentionInputs(1, q, k, pos, v=v)),
            naive_attend(name, scheme, 1, q, k, v, pos),
            atol=1e-5,
            rtol=1e-5,
        )


# the benchmark's attention axis and ratio columns; the tiny preset shrunk so that it runs in seconds
TINY = ["--configs", "tiny", "--segment-len", "16", "--batch", "2", "--model-set", "d_model=32,n_head=2,mem_len=16"]


def test_bench_attention_axis_and_ratios_to_a_baseline(tmp_path):
    assert (
        bench.main(
            [
                *TINY,
                "--schemes",
                f"{XL},{SINUSOID}",
                "--attention",
                "unfused,auto",
                "--memory",
                "on",
                "--ratio-to",
                SINUSOID,
                "--warmup",
                "1",
                "--reps",
                "1",
                "--threads",
                "1",
                "--matmul-max-n",
                "256",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    with open(tmp_path / "bench.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted((r["scheme"], r["attention"]) for r in rows) == sorted(
        (s, a) for s in (XL, SINUSOID) for a in ("unfused", "auto")
    )
    for r in rows:
        base = next(b for b in rows if b["scheme"] == SINUSOID and b["attention"] == r["attention"])
        for figure in ("train_ms", "train_cpu_ms", "eval_ms", "eval_cpu_ms"):
            ratio = float(r[figure.replace("_ms", "_ratio")])
            assert ratio == pytest.approx(float(r[figure]) / float(base[figure]), rel=1e-3)
            assert r["scheme"] != SINUSOID or ratio == 1.0


def test_bench_point_the_fused_path_cannot_run_says_why():
    bc = bench.BenchConfig.preset("tiny", segment_len=16, batch_size=2, d_model=32, n_head=2, mem_len=16)
    r = bench.bench_one(bc, SHAW, attention="fused", warmup=1, reps=1, matmul_peak=1e9, matmul_peak_cpu=1e9)
    assert r.attention == "fused" and math.isnan(r.train_ms) and math.isnan(r.eval_ms)
    assert "no backward on CPU" in r.extra["not_run"]


def test_bench_rejects_an_unknown_attention_value(capsys):
    assert bench.main([*TINY, "--schemes", XL, "--attention", "flash"]) == 2
    assert "flash" in capsys.readouterr().err


def test_attention_impl_is_no_part_of_a_runs_identity(tmp_path):
    """A run may resume with another attention path (the same math); any other model change is refused."""
    from posenc_lab.rundir import RunDir, RunDirError, run_identity

    run = RunDir(tmp_path)
    config = {"seed": 0, "model": {"d_model": 16, "attention_impl": "unfused"}, "data": {}, "optim": {}}
    run.write_record(run_identity(config, None), None)
    run.check(run_identity({**config, "model": {"d_model": 16, "attention_impl": "fused"}}, None))
    with pytest.raises(RunDirError, match="model.d_model: run 16, now 32"):
        run.check(run_identity({**config, "model": {"d_model": 32, "attention_impl": "unfused"}}, None))


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU: only there does the compiled flex_attention kernel run with its backward",
)
@pytest.mark.parametrize("name", (*FUSED, FOX))
def test_compiled_cuda_fused_equals_unfused(monkeypatch, name):
    """What attention_impl=auto trains with on a GPU: the compiled kernels, forward and backward, over two
    segments with memory (the memory given from the start, so that one shape compiles)."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    B, L, M, D = 2, 64, 64, 64
    cfg = dict(n_layer=2, d_model=D, n_head=4, d_inner=128, mem_len=M, same_length=True, dropout=0.0, posenc=name)
    tokens = torch.randint(256, (B, 2, L), device="cuda")
    first_mems = [torch.randn(B, M, D, device="cuda") for _ in range(2)]
    results = []
    for impl in ("unfused", "fused"):
        torch.manual_seed(1)
        model = MemoryTransformer(ModelConfig(**cfg, attention_impl=impl)).cuda()
        mems, total = first_mems, 0.0
        for seg in tokens.unbind(1):
            out = model(seg, seg.roll(-1, 1), mems=mems)
            mems, total = out.mems, total + out.loss
        results.append((total.detach(), torch.autograd.grad(total, list(model.parameters()))))
    torch.testing.assert_close(results[1][0], results[0][0], atol=1e-4, rtol=1e-4)
    for (what, _), a, b in zip(model.named_parameters(), results[1][1], results[0][1]):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3, msg=lambda m, what=what: f"grad of {what}: {m}")


@pytest.mark.parametrize("name", (KERPLE_LOG, KERPLE_POWER, SANDWICH, FIRE))
def test_bias_schemes_auto_rule_is_alibis_or_t5s(name, monkeypatch):
    """auto: never on CPU; on CUDA a learned bias fuses from any key count (as t5), a fixed one never (as alibi)."""
    scheme = make_scheme(name)
    assert scheme.fused_from_keys == (None if name == SANDWICH else 0)
    on_cuda = type("Q", (), {"device": torch.device("cuda")})()
    assert fused.use_fused(scheme, on_cuda, torch.empty(1, 1, 64, 1), 0.0) is (name != SANDWICH)
    monkeypatch.setattr(fused, "_flex", lambda: pytest.fail("flex_attention called on CPU"))
    q, k, v = qkv(5, 3)
    scheme.attend(AttentionInputs(1, q.requires_grad_(), k, make_positions(5, 3), v=v)).sum().backward()
