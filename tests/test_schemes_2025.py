"""The data-dependent schemes of issue 30 (fox, stickbreaking, path) against naive per-pair references written
from docs/SCHEMES.md, forward and backward (q, k, v, the layer input and every parameter), with and without
memory and the same-length mask; the choices each paper leaves open, pinned; and the entry points.

The references take the papers' own formulations where the implementation takes a shortcut: FoX's decay is the
sum of the log gates of the tokens between (the implementation subtracts two cumulative sums), the stick is
broken key by key from the query outwards (the implementation sums logs over reversed keys), PaTH's transform is
the product of the H_t applied to k_j one token at a time (the implementation is chunked, the UT transform).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from posenc_lab.positional import SCHEMES, fused, scheme_options
from posenc_lab.positional.path import path_scores
from tests.schemes import FOX, PATH, STICKBREAKING
from tests.test_fused import grads, reference  # noqa: F401 (a fixture)
from tests.test_schemes import DH, MASKS, B, H, inputs, make_positions, make_scheme, masked_softmax, qkv

NEW = (FOX, STICKBREAKING, PATH)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def naive_fox(scheme, layer, q, k, v, pos, x):
    """softmax(q.k / sqrt(d_h) + sum_{l=j+1..i} log sigmoid(w_h . x_l + b_h)) v, the sum taken per pair."""
    log_f = F.logsigmoid(scheme.gate[layer](x)).permute(0, 2, 1)  # [B, H, N]
    L, N = pos.visible.shape
    M = N - L
    scores = q @ k.transpose(-1, -2) / math.sqrt(DH)
    decay = torch.zeros(B, H, L, N)
    for i in range(L):
        for j in range(N):
            if pos.visible[i, j]:
                decay[:, :, i, j] = log_f[:, :, j + 1 : M + i + 1].sum(-1)
    return masked_softmax(scores + decay, pos.visible) @ v


def naive_stickbreaking(scheme, layer, q, k, v, pos, x):
    """From the query outwards: each visible key takes beta = sigmoid(q.k / sqrt(d_h)) of the stick left, the stick
    left at the end goes to the head's vector b_h."""
    L, N = pos.visible.shape
    out = torch.zeros(B, H, L, DH)
    for i in range(L):
        stick = torch.ones(B, H)
        for j in reversed(range(N)):
            if not pos.visible[i, j] or (pos.k[j] == pos.q[i] and not scheme.attend_current):
                continue
            beta = torch.sigmoid((q[:, :, i] * k[:, :, j]).sum(-1) / math.sqrt(DH))
            out[:, :, i] += (beta * stick)[..., None] * v[:, :, j]
            stick = stick * (1 - beta)
        out[:, :, i] += stick[..., None] * scheme.remainder[layer][None]
    return out


def naive_path_transforms(scheme, layer, x):
    """w_t = normalize(silu(conv3(W x)_t)) per head (the convolution written out, zeros before the first), beta_t =
    2 sigmoid(W_beta x_t + b)."""
    w_in = scheme.w[layer](x)  # [B, N, D]
    if scheme.short_conv:
        kernel = scheme.conv[layer].weight[:, 0]  # [D, 3]: tap 2 is the current token
        padded = F.pad(w_in, (0, 0, 2, 0))
        w_in = F.silu(sum(padded[:, tap : tap + x.shape[1]] * kernel[:, tap] for tap in range(3)))
    w = w_in.view(B, x.shape[1], H, DH).permute(0, 2, 1, 3)
    w = w / w.norm(dim=-1, keepdim=True)
    return w, 2 * torch.sigmoid(scheme.beta[layer](x)).permute(0, 2, 1)


def naive_path(scheme, layer, q, k, v, pos, x):
    """s_ij = q_i^T H_{M+i} ... H_{j+1} k_j / sqrt(d_h): k_j carried through H_{j+1}, then H_{j+2}, ... one by one."""
    w, beta = naive_path_transforms(scheme, layer, x)
    return masked_softmax(path_per_pair(q, k, w, beta) / math.sqrt(DH), pos.visible) @ v


def path_per_pair(q, k, w, beta):
    """[B, H, L, N] q_i^T H_{M+i} ... H_{j+1} k_j, k_j carried through H_{j+1}, then H_{j+2}, ... one by one (later
    keys: 0)."""
    L, N = q.shape[2], k.shape[2]
    M = N - L
    rows = []
    for i in range(L):
        row = []
        for j in range(N):
            key = k[:, :, j]
            for t in range(j + 1, M + i + 1):  # H_t key = key - beta_t (w_t . key) w_t
                key = key - beta[:, :, t, None] * (w[:, :, t] * key).sum(-1, keepdim=True) * w[:, :, t]
            row.append((q[:, :, i] * key).sum(-1) if j <= M + i else torch.zeros(B, H, dtype=q.dtype))
        rows.append(torch.stack(row, -1))
    return torch.stack(rows, -2)


NAIVE = {FOX: naive_fox, STICKBREAKING: naive_stickbreaking, PATH: naive_path}


def assert_equals_naive(name, scheme, q, k, v, pos, x, layer=1):
    """Output, and the gradients of q, k, v, the layer input and every parameter, against the per-pair loops."""
    inputs_ = [q, k, v, x, *scheme.parameters()]
    out = scheme.attend(layer, q, k, v, pos, 0.0, x)
    want = NAIVE[name](scheme, layer, q, k, v, pos, x)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    names = ["q", "k", "v", "context", *dict(scheme.named_parameters())]
    for got, ref, what in zip(grads(out, inputs_), grads(want, inputs_), names):
        if ref is None or not ref.any():
            assert got is None or not got.any(), what
        else:
            torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-4, msg=lambda m, what=what: f"grad of {what}: {m}")


def new_inputs(L, M):
    return (t.requires_grad_() for t in (*qkv(L, M), inputs(L, M)))


@pytest.mark.parametrize("L, M, same_length", MASKS)
@pytest.mark.parametrize("name", NEW)
def test_each_equals_its_naive_reference_forward_and_backward(name, L, M, same_length):
    """With and without memory (M = 0, M < L, M = L, M > L) and the same-length mask; the unfused path (fox: SDPA
    with its [B, H, L, N] bias)."""
    scheme = make_scheme(name).train()
    scheme.attention_impl = "unfused"
    q, k, v, x = new_inputs(L, M)
    assert_equals_naive(name, scheme, q, k, v, make_positions(L, M, same_length), x)


@pytest.mark.parametrize("L, M, same_length", [(5, 0, False), (4, 9, False), (5, 3, True)])
def test_fox_fused_path_equals_naive(reference, L, M, same_length):  # noqa: F811
    """FoX through flex_attention (its uncompiled reference on CPU): the score_mod that CUDA compiles, reading two
    entries of the captured cumulative gates per pair, their gradient (so the gate's) included."""
    scheme = make_scheme(FOX).train()
    scheme.attention_impl = "fused"
    q, k, v, x = new_inputs(L, M)
    assert_equals_naive(FOX, scheme, q, k, v, make_positions(L, M, same_length), x)


@pytest.mark.slow  # compiles flex_attention for the CPU: 15-60 s on 2 shared cores
def test_fox_compiled_cpu_forward_equals_naive():
    """What attention_impl=fused runs in CPU evaluation: the compiled kernel with the cumulative gates captured
    (no gradient: torch refuses flex_attention's backward on CPU; the CUDA test of tests/test_fused.py runs it)."""
    scheme = make_scheme(FOX).eval()
    scheme.attention_impl = "fused"
    q, k, v, x = (t.detach() for t in new_inputs(5, 9))
    pos = make_positions(5, 9, same_length=True)
    with torch.no_grad():
        torch.testing.assert_close(
            scheme.attend(1, q, k, v, pos, 0.0, x), naive_fox(scheme, 1, q, k, v, pos, x), atol=1e-5, rtol=1e-5
        )


def test_fox_takes_the_fused_path_on_cuda_and_sdpa_on_cpu(monkeypatch):
    scheme = make_scheme(FOX)
    on_cuda = type("Q", (), {"device": torch.device("cuda")})()
    assert scheme.fused_from_keys == 0 and fused.use_fused(scheme, on_cuda, torch.empty(1, 1, 64, 1), 0.0)
    monkeypatch.setattr(fused, "_flex", lambda: pytest.fail("flex_attention called on CPU"))
    q, k, v, x = new_inputs(5, 3)
    scheme.attend(1, q, k, v, make_positions(5, 3), 0.0, x).sum().backward()
    assert scheme.gate[1].weight.grad.abs().sum() > 0


@pytest.mark.parametrize("L, M, C", [(5, 0, 2), (5, 3, 2), (4, 9, 3), (7, 6, 4), (3, 11, 4), (6, 6, 64), (64, 64, 16)])
def test_path_chunks_equal_the_product_per_pair(L, M, C):
    """The chunked form for chunks of C tokens (queries and memory not multiples of C: padding), every beta in
    (0, 2) and every w a unit vector, against the per-pair product in float64."""
    q, k = torch.randn(B, H, L, DH), torch.randn(B, H, M + L, DH)
    w, beta = F.normalize(torch.randn(B, H, M + L, DH), dim=-1), 2 * torch.rand(B, H, M + L)
    want = path_per_pair(*(x.double() for x in (q, k, w, beta)))
    visible = make_positions(L, M).visible
    got = path_scores(q, k, w, beta, chunk=C)
    torch.testing.assert_close(got.double()[..., visible], want[..., visible], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("L, M, C", [(5, 3, 2), (4, 9, 3), (7, 6, 4)])
def test_path_chunks_carry_the_gradient_across_chunks(L, M, C):
    """Backward through three to seven chunks (q carried back through U of each chunk passed, k to its chunk's end):
    the gradients of q, k, w and beta against autograd through the per-pair product, in float64."""
    q, k = torch.randn(B, H, L, DH, dtype=torch.float64), torch.randn(B, H, M + L, DH, dtype=torch.float64)
    w = F.normalize(torch.randn(B, H, M + L, DH, dtype=torch.float64), dim=-1)
    beta = 2 * torch.rand(B, H, M + L, dtype=torch.float64)
    visible = make_positions(L, M).visible
    weights = torch.randn(B, H, L, M + L, dtype=torch.float64) * visible

    grads = []
    for f in (lambda *x: path_scores(*x, chunk=C), path_per_pair):
        leaves = [t.clone().requires_grad_() for t in (q, k, w, beta)]
        grads.append(torch.autograd.grad((f(*leaves) * weights).sum(), leaves))
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-8)


# --------------------------------------------------------------------------------------------
# What each paper leaves open, pinned
# --------------------------------------------------------------------------------------------


def test_documented_options_exist():
    assert scheme_options(FOX) == {}
    assert scheme_options(STICKBREAKING) == {"attend_current": False}
    assert scheme_options(PATH) == {"w_rank": 32, "short_conv": True}


def test_each_reads_no_position_and_refuses_random_positions():
    for name in NEW:
        assert SCHEMES[name].random_positions_refused and "no position" in SCHEMES[name].random_positions_refused
        assert "between" in SCHEMES[name].not_translation_invariant


def test_fox_gate_starts_as_the_authors():
    """The model's initialisation gives the gate bias 0 and weights N(0, 0.02): f starts near 1/2."""
    from tests.models import make_model

    model = make_model(FOX, n_layer=2, randomize=None, d_model=64, n_head=4)
    for gate in model.scheme.gate:
        assert not gate.bias.any() and abs(gate.weight.std().item() - 0.02) < 0.004


def test_fox_oldest_key_gate_is_never_used_and_a_closed_gate_cuts_the_past():
    """The gate of key 0 enters no pair (the sum runs over j+1..i); a gate f -> 0 at token t hides every key
    before t from every query after it."""
    scheme, pos = make_scheme(FOX), make_positions(4, 4)
    x = inputs(4, 4)
    with torch.no_grad():
        bias = scheme.score_bias(0, pos, x).dense(pos)
        y = x.clone()
        y[:, 0] += 5.0
        torch.testing.assert_close(scheme.score_bias(0, pos, y).dense(pos), bias)
        scheme.gate[0].bias.fill_(-1e4)  # f ~ 0 everywhere: only the diagonal survives
        q, k, v = qkv(4, 4)
        probs = scheme.attention_probs(0, q, k, pos, x)
    own = torch.arange(4)[:, None] + 4 == torch.arange(8)[None, :]
    torch.testing.assert_close(probs[..., own], torch.ones(B, H, 4))


@pytest.mark.parametrize("attend_current", [False, True])
def test_stickbreaking_nearest_key_breaks_first_and_the_rest_is_left(attend_current):
    """One key with beta ~ 1 just before the query takes the whole stick: nothing reaches the keys behind it; with
    every beta ~ 0 the stick is left whole and the output is b_h."""
    scheme, (L, M) = make_scheme(STICKBREAKING, attend_current=attend_current), (3, 2)
    pos, (q, k, v) = make_positions(L, M), qkv(L, M)
    q = torch.ones(B, H, L, DH)
    k = torch.full_like(k, -50.0)  # beta ~ 0 everywhere
    with torch.no_grad():
        out = scheme.attend(0, q, k, v, pos, 0.0)
        torch.testing.assert_close(out, scheme.remainder[0][None, :, None].expand_as(out))
        k[:, :, M + L - 2] = 50.0  # the last query's nearest other key: beta ~ 1
        probs = scheme.attention_probs(0, q, k, pos)
    row = probs[:, :, -1]
    own = M + L - 1
    assert torch.allclose(row[..., M + L - 2], torch.ones(B, H), atol=1e-6)
    assert (row[..., : M + L - 2] < 1e-6).all()
    assert torch.equal(row[..., own] == 0, torch.full((B, H), not attend_current))


def test_path_transforms_are_unit_with_beta_in_zero_two_and_start_at_one():
    scheme = make_scheme(PATH)
    with torch.no_grad():
        for p in scheme.beta.parameters():
            p.zero_()
        w, beta = scheme.transforms(0, inputs(5, 3))
    torch.testing.assert_close(w.norm(dim=-1), torch.ones(B, H, 8))
    torch.testing.assert_close(beta, torch.ones(B, H, 8))  # 2 sigmoid(0): H = I - w w^T at the start


@pytest.mark.parametrize("short_conv, w_rank", [(True, 32), (False, None)])
def test_path_options_change_the_transforms(short_conv, w_rank):
    scheme = make_scheme(PATH, short_conv=short_conv, w_rank=w_rank).train()
    assert len(scheme.conv) == (2 if short_conv else 0)
    q, k, v, x = new_inputs(5, 3)
    assert_equals_naive(PATH, scheme, q, k, v, make_positions(5, 3), x)


def test_path_short_conv_reaches_two_tokens_back_only():
    """w_t reads x_{t-2}, x_{t-1}, x_t: a change at token 2 moves w_2, w_3, w_4 and nothing else."""
    scheme, x = make_scheme(PATH), inputs(6, 0)
    y = x.clone()
    y[:, 2] += 1.0
    with torch.no_grad():
        moved = (scheme.transforms(0, x)[0] - scheme.transforms(0, y)[0]).abs().amax((0, 1, 3)) > 1e-6
    assert moved.tolist() == [False, False, True, True, True, False]


@pytest.mark.parametrize(
    "name, options, match",
    [
        (PATH, {"w_rank": 0}, r"path: posenc.w_rank must be an integer >= 1 or null .*got 0"),
        (PATH, {"short_conv": "yes"}, r"path: posenc.short_conv must be true or false, got 'yes'"),
        (STICKBREAKING, {"attend_current": 1}, r"stickbreaking: posenc.attend_current must be true or false, got 1"),
    ],
)
def test_bad_options_raise_naming_the_value(name, options, match):
    with pytest.raises(ValueError, match=match):
        make_scheme(name, **options)


def test_without_the_layer_input_they_say_what_they_need():
    q, k, v = qkv(5, 3)
    for name in (FOX, PATH):
        with pytest.raises(ValueError, match=rf"{name}: .*layer's input.*context"):
            make_scheme(name).attend(0, q, k, v, make_positions(5, 3), 0.0)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, dict]:
    """posenc=<name> with no other edit: each trained 2 tiny steps with memory on the recall stream (episode
    resets included); name -> results.json. Exact resume: tests/test_lit.py."""
    from posenc_lab.train import train
    from tests.helpers_train import compose_config, tiny

    work = tmp_path_factory.mktemp("datadep-runs")
    return {
        name: train(compose_config("train", tiny(work / name, work / "cache", f"posenc={name}", steps=2)))
        for name in NEW
    }


@pytest.mark.parametrize("name", NEW)
def test_each_evaluates_past_its_training_memory(trained, name):
    """Evaluation loads every parameter of the scheme (its gates and maps) and serves three times the memory."""
    from posenc_lab.evaluate import evaluate_checkpoint, load_model

    longer = evaluate_checkpoint(trained[name]["checkpoint"], mem_len=48, max_batches=2)
    assert math.isfinite(longer["loss"]) and longer["mem_len"] == 48 and longer["scheme"] == name
    saved = torch.load(trained[name]["checkpoint"], weights_only=True)["state_dict"]
    loaded = load_model(trained[name]["checkpoint"]).scheme.state_dict()
    assert loaded and all(torch.equal(saved[f"model.scheme.{key}"], value) for key, value in loaded.items())


def test_compare_reads_their_runs(trained, tmp_path, capsys):
    """posenc-lab compare, fox against path on the recall stream (a word corpus): each side's figure is the
    perplexity of its own dump's mean loss, the difference theirs in nats per word."""
    import re
    from pathlib import Path

    import numpy as np

    from posenc_lab_analysis import compare

    runs = [str(Path(trained[n]["checkpoint"]).parents[1]) for n in (FOX, PATH)]
    assert compare.main([*runs, "--n-streams", "4", "--n-tokens", "32", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    means = []
    for side, run in zip("AB", runs):
        (dump,) = tmp_path.glob(f"{side}_*.npz")
        with np.load(dump) as d:
            means.append(float(d["loss"][0][d["scored"]].mean()))
        ppl = re.search(rf"^{side}: {re.escape(run)} \(1 seed\(s\)\): val ppl (\d+\.\d+) ", out, re.M)
        assert ppl and float(ppl.group(1)) == pytest.approx(math.exp(means[-1]), rel=1e-3), out
    shown = re.search(r"^A - B: ([-+]\d+\.\d+) .* nats per word", out, re.M)
    assert shown and float(shown.group(1)) == pytest.approx(means[0] - means[1], abs=1e-4), out
    assert "one seed" in out
