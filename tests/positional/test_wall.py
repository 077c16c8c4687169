"""Wall attention (posenc_lab/positional/wall.py) against a per-pair reference written from the formula, forward and
backward (q, k, v, the layer input and the gates), with memory, the same-length mask and query blocks of every size;
gates closed hard (where one reference for the whole row would overflow); memory as one long pass; a static
memory's empty slots; its options."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from posenc_lab.positional import SCHEMES, AttentionInputs, Positions, scheme_options
from posenc_lab.positional.wall import split
from tests.positional.test_fused import grads
from tests.positional.test_schemes import DH, MASKS, B, H, inputs, make_positions, make_scheme, masked_softmax, qkv
from tests.schemes import WALL


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def naive_wall(scheme, layer, q, k, v, pos, x):
    """softmax_j(sum_n q_in k_jn exp(sum_{l=j+1..i} g_ln) / sqrt(d_h)) v, g = logsigmoid(W x + b + gate_bias),
    the gates summed per pair (no cumulative sum, no anchor)."""
    g = F.logsigmoid(scheme.gate[layer](x) + scheme.gate_bias).view(B, -1, H, DH).transpose(1, 2)  # [B, H, N, d_h]
    if pos.valid is not None:
        g = g * pos.valid[:, None]
    L, N = pos.visible.shape
    M = N - L
    scores = torch.zeros(B, H, L, N)
    for i in range(L):
        for j in range(N):
            if pos.visible[i, j]:
                decay = torch.exp(g[:, :, j + 1 : M + i + 1].sum(2))  # [B, H, d_h], one factor per channel
                scores[:, :, i, j] = (q[:, :, i] * k[:, :, j] * decay).sum(-1) / math.sqrt(DH)
    return masked_softmax(scores, pos.visible) @ v


def assert_equals_naive(scheme, q, k, v, pos, x, layer=1, atol=1e-5):
    """Output, and the gradients of q, k, v, the layer input and the gate's weight and bias."""
    inputs_ = [q, k, v, x, *scheme.gate[layer].parameters()]
    out = scheme.attend(AttentionInputs(layer, q, k, pos, v=v, context=x))
    want = naive_wall(scheme, layer, q, k, v, pos, x)
    torch.testing.assert_close(out, want, atol=atol, rtol=1e-5)
    for got, ref, what in zip(grads(out, inputs_), grads(want, inputs_), ["q", "k", "v", "context", "W", "b"]):
        assert ref.abs().sum() > 0, what
        torch.testing.assert_close(got, ref, atol=atol, rtol=1e-4, msg=lambda m, what=what: f"grad of {what}: {m}")


def new_inputs(L, M):
    return (t.requires_grad_() for t in (*qkv(L, M), inputs(L, M)))


def new_scheme(leaf: int | None, **options):
    scheme = make_scheme(WALL, **{"gate_bias": 0.0, **options}).train()  # f near 1/2: the decay shows at small sizes
    scheme.leaf = leaf
    return scheme


@pytest.mark.parametrize("L, M, same_length", MASKS)
@pytest.mark.parametrize("leaf", [1, 2, 3, 8, None])
def test_wall_equals_naive_forward_and_backward(L, M, same_length, leaf):
    """Leaves of 1 (the diagonal alone), 2 and 3 queries under levels of halves (5 queries padded to 8 or 6), one
    leaf of 8 > L (no level), and the leaf that ``split`` chooses."""
    q, k, v, x = new_inputs(L, M)
    assert_equals_naive(new_scheme(leaf), q, k, v, make_positions(L, M, same_length), x)


@pytest.mark.parametrize("same_length", [False, True])
@pytest.mark.parametrize("L, M, leaf", [(16, 8, 1), (13, 6, 2), (12, 2, 3)])
def test_many_levels_equal_naive(L, M, same_length, leaf):
    """Four levels of halves under the memory (16 = 1 x 2^4), three with padding (13 -> 2 x 2^3), two with leaves
    of 3 (12 = 3 x 2^2)."""
    q, k, v, x = new_inputs(L, M)
    assert_equals_naive(new_scheme(leaf), q, k, v, make_positions(L, M, same_length), x)


@pytest.mark.parametrize("L, M", [(256, 256), (512, 512), (257, 256), (100, 0), (5, 3), (1, 4)])
def test_split_pads_little_and_keeps_leaves_small(L, M):
    """The L queries padded to c 2^n: at the presets' powers of two, leaves of 1 and no padding; elsewhere fewer
    than twice as many queries and leaves of at most 8 (a leaf's pairs cost LEAF_COST matmul pairs each)."""
    c, n = split(L, M)
    assert L <= c * 2**n < 2 * L or (L, c, n) == (1, 1, 0)
    assert c <= 8
    if L & (L - 1) == 0:
        assert (c, 2**n) == (1, L)


def test_gates_closed_hard_stay_exact_where_one_reference_would_overflow():
    """Gates of about e^-64 at five tokens, e^-0.018 elsewhere (g = logsigmoid(x + 4), W = I): P falls by 64 per
    closed token and channel, so over the row exp(P_i - P_ref) for one reference would pass fp32's range (e^88) one
    way or the other; the anchors keep every factor <= 1. Behind a closed gate a key's logit is ~0: a decay
    multiplies q . k (it does not subtract from the logit as FoX's does), so those keys share alike."""
    L, M, closed = 7, 6, [2, 5, 8, 9, 11]
    scheme = new_scheme(2, gate_bias=4.0)
    with torch.no_grad():
        scheme.gate[1].weight.copy_(torch.eye(scheme.dims.d_model))
        scheme.gate[1].bias.zero_()
    q, k, v = (t.requires_grad_() for t in qkv(L, M))
    x = torch.zeros(B, M + L, scheme.dims.d_model)
    x[:, closed] = -68.0
    x.requires_grad_()
    pos = make_positions(L, M)
    P = scheme.cumulative_gates(1, x, pos)
    assert (P[..., 0, :] - P[..., -1, :]).min() > 2 * 88  # beyond one reference's reach
    assert_equals_naive(scheme, q, k, v, pos, x, atol=1e-4)  # P near -320: fp32 cumulative sums, as FoX's
    with torch.no_grad():
        probs = scheme.attention_probs(AttentionInputs(1, q, k, pos, context=x))
    assert torch.isfinite(probs).all()
    behind = probs[..., -1, : M + 5]  # the last query's keys before the closed gate at key column 11 (position 5)
    torch.testing.assert_close(behind, behind[..., :1].expand_as(behind))


@pytest.mark.parametrize("L, M", [(5, 3), (4, 9)])
def test_memory_equals_one_long_pass(L, M):
    """With the memory's own gates (its hidden states are the context), a segment scores as the last L queries of
    one pass over the M + L tokens; the oldest memory key's gate enters no pair."""
    scheme = new_scheme(2).eval()
    q_all, k, v = qkv(M + L, 0)
    x = inputs(M + L, 0)
    with torch.no_grad():
        long = scheme.attend(AttentionInputs(0, q_all, k, make_positions(M + L, 0), v=v, context=x))[:, :, M:]
        torch.testing.assert_close(
            scheme.attend(AttentionInputs(0, q_all[:, :, M:], k, make_positions(L, M), v=v, context=x)), long
        )
        y = x.clone()
        y[:, 0] += 5.0
        torch.testing.assert_close(
            scheme.attend(AttentionInputs(0, q_all[:, :, M:], k, make_positions(L, M), v=v, context=y)), long
        )


def test_empty_memory_slots_have_no_gate_and_no_share():
    """A static memory's slots not yet filled (pos.valid False) may hold anything: the output is the one without
    them."""
    L, M, empty = 5, 6, 4
    scheme = new_scheme(2).eval()
    q, k, v = qkv(L, M)
    x = inputs(L, M)
    pos = make_positions(L, M)
    valid = torch.arange(M + L) >= empty
    full = Positions(pos.q, pos.k, pos.offset, pos.visible & valid, valid=valid)
    with torch.no_grad():
        junk = [t.clone() for t in (k, v, x)]
        for t in junk:
            t[:, ..., :empty, :] = 1e3  # the invalid slots: far out, as a reset's stale states
        got = scheme.attend(AttentionInputs(1, q, junk[0], full, v=junk[1], context=junk[2]))
        want = scheme.attend(
            AttentionInputs(
                1, q, k[:, :, empty:], make_positions(L, M - empty), v=v[:, :, empty:], context=x[:, empty:]
            )
        )
    torch.testing.assert_close(got, want)


def test_gate_starts_near_one_under_the_models_init():
    """The model zeroes every bias; the offset gate_bias = 8 still starts f at sigmoid(8) (fla's gate_init_bias)."""
    from tests.models import make_model

    scheme = make_model(WALL, randomize=None).scheme
    assert not scheme.gate[0].bias.any() and abs(scheme.gate[0].weight.std().item() - 0.02) < 0.01
    x = torch.randn(2, 6, 16)
    P = scheme.cumulative_gates(0, x, make_positions(6, 0))
    torch.testing.assert_close(
        P[:, :, 0], torch.full_like(P[:, :, 0], F.logsigmoid(torch.tensor(8.0)).item()), atol=1e-3, rtol=0
    )


def test_documented_options_kind_and_refusals():
    assert scheme_options(WALL) == {"gate_bias": 8.0}
    cls = SCHEMES[WALL]
    assert cls.kind == "relative" and "no position" in cls.random_positions_refused
    assert "between" in cls.not_translation_invariant


@pytest.mark.parametrize(
    "options, match",
    [
        ({"gate_bias": float("inf")}, r"^wall: posenc.gate_bias must be a finite number \(8 in fla\), got inf$"),
        ({"gate_bias": "open"}, r"^wall: posenc.gate_bias must be a number, got 'open'$"),
    ],
)
def test_bad_options_are_one_line(options, match):
    with pytest.raises(ValueError, match=match):
        make_scheme(WALL, **options)


def test_without_the_layer_input_it_says_what_it_needs():
    with pytest.raises(ValueError, match=r"^wall: the forget gates come from the layer's input; attend needs context"):
        q, k, v = qkv(5, 3)
        make_scheme(WALL).attend(AttentionInputs(0, q, k, make_positions(5, 3), v=v))


def test_extra_flops_count_the_gate_projection():
    scheme = make_scheme(WALL)
    assert scheme.extra_flops(40, 24) == 2 * 64 * 16 * 16
