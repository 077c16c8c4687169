"""STRING (rope's ``string_shift`` and ``string_window``, posenc_lab/positional/rope.py): every pair scored at its
shifted distance (the equation), equal to the authors' two attentions merged by their log-sum-exp, forward and
backward, with memory; off while training; one checkpoint evaluated with and without it; bad values named."""

from __future__ import annotations

import pytest
import torch

from posenc_lab.positional import AttentionInputs
from posenc_lab.positional.base import Softmax
from posenc_lab.positional.rope import rotate_half
from tests.models import make_model, memory_and_window
from tests.positional.test_schemes import B, make_positions, make_scheme, qkv
from tests.schemes import ROPE

S, W = 6, 2  # shift and local window
CASES = [(12, 0, False), (8, 7, False), (5, 9, False), (8, 7, True)]  # (L, M, same_length)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def rotated(scheme, x, positions):
    cos, sin = scheme._cos_sin(positions, x.dtype)
    return x * cos + rotate_half(x) * sin


def equation_logits(scheme, q, k, pos):
    """z_ij = rot(q_i, i') . rot(k_j, j) / sqrt(d_h), with i' - j the shifted distance d' (d, or d - S + W from S
    on), pair by pair; -inf where not visible."""
    L, N = pos.visible.shape
    z = torch.full((B, q.shape[1], L, N), float("-inf"))
    for i in range(L):
        for j in range(N):
            if not pos.visible[i, j]:
                continue
            d = int(pos.q[i] - pos.k[j])
            shifted = d if d < S else d - S + W
            qi = rotated(scheme, q[:, :, i : i + 1], (pos.k[j] + shifted).reshape(1))
            kj = rotated(scheme, k[:, :, j : j + 1], pos.k[j].reshape(1))
            z[:, :, i, j] = (qi * kj).sum(-1)[..., 0] / q.shape[-1] ** 0.5
    return z


def authors_attention(scheme, q, k, v, pos):
    """The authors' algorithm (their string_flash_forward, written with plain softmaxes): the neighbours (distance <
    S) with the original positions, the rest with the queries' positions shifted by W - S, each its own softmax,
    merged by the log-sum-exps: o = o_near sigmoid(lse_near - lse_far) + o_far sigmoid(lse_far - lse_near)."""
    near_mask = pos.visible & (pos.distance < S)
    far_mask = pos.visible & (pos.distance >= S)
    k_rot = rotated(scheme, k, pos.k)
    scale = q.shape[-1] ** -0.5
    parts = []
    for shift, mask in ((0, near_mask), (S - W, far_mask)):
        z = (rotated(scheme, q, pos.q - shift) @ k_rot.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf"))
        lse = z.logsumexp(-1, keepdim=True)
        out = torch.where(torch.isfinite(lse), torch.softmax(z, -1).nan_to_num() @ v, torch.zeros_like(q))
        parts.append((out, lse))
    (o_near, lse_near), (o_far, lse_far) = parts
    return o_near * torch.sigmoid(lse_near - lse_far) + o_far * torch.sigmoid(lse_far - lse_near)


def string_scheme():
    scheme = make_scheme(ROPE, string_shift=S, string_window=W)
    return scheme.eval()


@pytest.mark.parametrize("L, M, same_length", CASES)
def test_every_pair_is_scored_at_its_shifted_distance(L, M, same_length):
    scheme, pos = string_scheme(), make_positions(L, M, same_length)
    q, k, _ = qkv(L, M)
    z = equation_logits(scheme, q, k, pos)
    torch.testing.assert_close(
        scheme.attention_probs(AttentionInputs(0, q, k, pos)), torch.softmax(z, -1), atol=1e-5, rtol=1e-4
    )


@pytest.mark.parametrize("L, M, same_length", CASES)
def test_equals_the_authors_two_attentions_merged_forward_and_backward(L, M, same_length):
    scheme, pos = string_scheme(), make_positions(L, M, same_length)
    inputs = qkv(L, M)
    got_in, want_in = ([t.clone().requires_grad_() for t in inputs] for _ in range(2))
    got = scheme.attend(AttentionInputs(0, got_in[0], got_in[1], pos, v=got_in[2]))
    want = authors_attention(scheme, *want_in, pos)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    w = torch.randn_like(got)
    for which, a, b in zip(
        "qkv", torch.autograd.grad((got * w).sum(), got_in), torch.autograd.grad((want * w).sum(), want_in)
    ):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, msg=f"gradient of {which}")
    plain = make_scheme(ROPE).eval()
    if pos.distance[pos.visible].max() >= S:  # not vacuous: far pairs exist, and they move
        assert (plain.attend(AttentionInputs(0, want_in[0], want_in[1], pos, v=want_in[2])) - got).abs().max() > 1e-3


def test_a_sink_and_the_scale_compose_with_it():
    """STRING's logits go through the model's softmax: SSMax's scale on the whole logit, the sink in the denominator."""
    scheme, pos = string_scheme(), make_positions(8, 7)
    q, k, _ = qkv(8, 7)
    scale, sink = torch.rand(q.shape[1], 8, 1) + 0.5, torch.randn(q.shape[1])
    z = equation_logits(scheme, q, k, pos) * scale
    want = torch.exp(z - torch.logaddexp(z.logsumexp(-1, keepdim=True), sink[:, None, None]))
    got = scheme.attention_probs(AttentionInputs(0, q, k, pos, softmax=Softmax(scale, sink)))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_training_is_plain_rope_and_one_checkpoint_is_evaluated_with_and_without_it():
    """While training the scheme is rope itself; in evaluation, the same weights with STRING on score differently once
    the span passes S, identically within it; with memory (one layer) the last segment scores as the end of one long
    pass."""
    plain = make_model(ROPE, n_layer=2, mem_len=8, randomize="all")
    string = make_model(
        ROPE, n_layer=2, mem_len=8, randomize="all", posenc_kwargs={"string_shift": S, "string_window": W}
    )
    string.load_state_dict(plain.state_dict())
    x = torch.randint(0, 23, (B, 16))
    plain.train(), string.train()
    torch.testing.assert_close(string(x, x).loss, plain(x, x).loss)
    plain.eval(), string.eval()
    short = x[:, :S]  # every distance < S: nothing is shifted
    torch.testing.assert_close(string(short, short).logits, plain(short, short).logits)
    assert (string(x, x).logits - plain(x, x).logits).abs().max() > 1e-3
    string = make_model(
        ROPE, n_layer=1, mem_len=8, randomize="all", posenc_kwargs={"string_shift": S, "string_window": W}
    )
    L = 4  # one layer: its memory holds exactly the tokens a window pass would see
    out, window = memory_and_window(string, x[:, 4:], L)  # 12 tokens: the last segment's 8 memory keys and its 4
    torch.testing.assert_close(out.logits, window.logits[:, -L:], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"string_shift": 0, "string_window": 0}, r"^rope: posenc\.string_shift \(STRING's S: .*got 0$"),
        ({"string_shift": 4, "string_window": 4}, r"^rope: posenc\.string_window .* in \[0, string_shift=4\), got 4$"),
        ({"string_shift": 4}, r"^rope: posenc\.string_window .* got None$"),
        ({"string_window": 2}, r"^rope: posenc\.string_window=2 has no effect without posenc\.string_shift"),
    ],
)
def test_bad_values_are_one_line_naming_them(options, message):
    with pytest.raises(ValueError, match=message):
        make_scheme(ROPE, **options)
