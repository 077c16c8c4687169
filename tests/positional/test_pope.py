"""PoPE (posenc_lab/positional/pope.py) against a per-pair reference written from the paper's formula, forward and
backward, with memory, the same-length mask and gapped positions; memory as one long pass; the phase's range and
start; its options."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from posenc_lab.positional import AttentionInputs, scheme_options
from tests.positional.test_fused import grads
from tests.positional.test_schemes import DH, MASKS, B, H, make_positions, make_scheme, masked_softmax, qkv
from tests.schemes import POPE


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def naive_pope(scheme, q, k, v, pos):
    """a_ij = sum_c softplus(q_ic) softplus(k_jc) cos((p_i - p_j) theta_c - delta_hc) / sqrt(d_h), one pair at a
    time, theta_c = base^{-c/d_h} from its formula (float64), d_h of them."""
    theta = torch.tensor([scheme.base ** (-c / DH) for c in range(DH)], dtype=torch.float64)
    delta = scheme.phase  # [H, d_h], as the forward left it (projected into [-2 pi, 0])
    L, N = pos.visible.shape
    scores = torch.zeros(B, H, L, N)
    for i in range(L):
        for j in range(N):
            angle = (float(pos.q[i] - pos.k[j]) * theta).float() - delta  # [H, d_h]
            mags = F.softplus(q[:, :, i]) * F.softplus(k[:, :, j])  # [B, H, d_h]
            scores[:, :, i, j] = (mags * torch.cos(angle)).sum(-1) / math.sqrt(DH)
    return masked_softmax(scores, pos.visible) @ v


def assert_equals_naive(scheme, q, k, v, pos):
    """Output, and the gradients of q, k, v and the phase, against the per-pair reference."""
    inputs = [q, k, v, scheme.phase]
    out = scheme.attend(AttentionInputs(1, q, k, pos, v=v))
    want = naive_pope(scheme, q, k, v, pos)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    for got, ref, what in zip(grads(out, inputs), grads(want, inputs), ["q", "k", "v", "phase"]):
        assert ref.abs().sum() > 0, what
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-4, msg=lambda m, what=what: f"grad of {what}: {m}")


def new_scheme(**options):
    """make_scheme draws the phase from N(0, 0.5); here from inside its range, so projection does not hide it."""
    scheme = make_scheme(POPE, **options).train()
    with torch.no_grad():
        scheme.phase.uniform_(-2 * math.pi, 0.0)
    return scheme


@pytest.mark.parametrize("L, M, same_length", MASKS)
def test_pope_equals_naive_forward_and_backward(L, M, same_length):
    """Without memory, M < L, M = L, M > L, and the same-length mask: memory keys at negative positions."""
    q, k, v = (x.requires_grad_() for x in qkv(L, M))
    assert_equals_naive(new_scheme(), q, k, v, make_positions(L, M, same_length))


def test_another_base_and_the_attention_probabilities():
    scheme, pos = new_scheme(base=100.0), make_positions(4, 5)
    q, k, v = qkv(4, 5)
    with torch.no_grad():
        eye = torch.eye(9).expand(B, H, 9, 9)
        torch.testing.assert_close(
            scheme.attention_probs(AttentionInputs(0, q, k, pos)), naive_pope(scheme, q, k, eye, pos)
        )
    assert_equals_naive(scheme, *(x.requires_grad_() for x in (q, k, v)), pos)


@pytest.mark.parametrize("L, M", [(5, 3), (4, 9)])
def test_memory_equals_one_long_pass(L, M):
    """A segment of L queries over M memory keys scores as the last L queries of one pass over the M + L tokens."""
    scheme = new_scheme().eval()
    q_all, k, v = qkv(M + L, 0)
    with torch.no_grad():
        long = scheme.attend(AttentionInputs(0, q_all, k, make_positions(M + L, 0), v=v))[:, :, M:]
        torch.testing.assert_close(
            scheme.attend(AttentionInputs(0, q_all[:, :, M:], k, make_positions(L, M), v=v)), long
        )


def test_d_h_frequencies_and_the_score_is_the_content_magnitudes_at_distance_zero():
    """d_h frequencies base^{-c/d_h} (not d_h/2); at distance 0 with delta = 0 every cosine is 1: the score is
    softplus(q) . softplus(k) / sqrt(d_h), the "what" alone."""
    scheme = make_scheme(POPE)
    torch.testing.assert_close(scheme.inv_freq, torch.tensor([10000.0 ** (-c / DH) for c in range(DH)]))
    with torch.no_grad():
        scheme.phase.zero_()
        q, k = torch.randn(B, H, 1, DH), torch.randn(B, H, 1, DH)
        pos = make_positions(1, 0)
        qr, kr = scheme.rotate(0, q, k, pos)
    assert qr.shape == kr.shape == (B, H, 1, 2 * DH)
    want = (F.softplus(q) * F.softplus(k)).sum(-1) / math.sqrt(DH)
    torch.testing.assert_close((qr * kr).sum(-1) / math.sqrt(2 * DH), want)  # SDPA's own scale, 1/sqrt(2 d_h)


def test_the_phase_is_projected_into_its_range_and_keeps_learning_on_the_boundary():
    """After an optimiser step pushed it out, delta is clamped back into [-2 pi, 0] before it is used (the
    forward values of x-transformers' clamp); a phase at 0 still gets a gradient."""
    scheme = make_scheme(POPE).train()
    with torch.no_grad():
        scheme.phase.fill_(0.7)
        scheme.phase[0] = -9.0
    q, k, v = qkv(5, 3)
    out = scheme.attend(AttentionInputs(0, q, k, make_positions(5, 3), v=v))
    assert (scheme.phase[0] == -2 * math.pi).all() and (scheme.phase[1:] == 0).all()
    (g,) = grads(out, [scheme.phase])
    assert g[1:].abs().min() > 0


def test_phase_starts_at_zero_or_uniform_and_the_model_keeps_it():
    from tests.models import make_model

    assert not make_model(POPE, randomize=None).scheme.phase.any()  # the gpt2 init keeps a scheme's own tables
    phase = make_model(POPE, randomize=None, posenc_kwargs={"phase_init": "uniform"}).scheme.phase
    assert (phase <= 0).all() and (phase >= -2 * math.pi).all() and phase.std() > 1.0


def test_documented_options_and_kind():
    from posenc_lab.positional import SCHEMES

    assert scheme_options(POPE) == {"base": 10000.0, "phase_init": "zero"}
    assert SCHEMES[POPE].kind == "relative" and SCHEMES[POPE].random_positions_refused is None
    assert SCHEMES[POPE].not_translation_invariant is None


@pytest.mark.parametrize(
    "options, match",
    [
        ({"base": 1.0}, r"^pope: posenc.base must be a number > 1 \(10000 in the paper\), got 1.0$"),
        ({"base": float("nan")}, r"^pope: posenc.base must be a number > 1 .*got nan$"),
        ({"phase_init": "random"}, r"^pope: posenc.phase_init must be one of zero, uniform, got 'random'$"),
        ({"base": "ten"}, r"^pope: posenc.base must be a number, got 'ten'$"),
    ],
)
def test_bad_options_are_one_line(options, match):
    with pytest.raises(ValueError, match=match):
        make_scheme(POPE, **options)


def test_extra_flops_are_the_second_half_of_the_scores():
    scheme = make_scheme(POPE)
    assert scheme.extra_flops(8, 4) == 2 * 8 * 12 * 16  # 2 L N D: q . k over 2 d_h channels
