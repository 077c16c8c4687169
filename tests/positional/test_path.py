"""PaTH (posenc_lab/positional/path.py): the chunked form equals the product per
pair, gradients across chunks, and the transforms (unit w, beta in (0, 2), the short convolution's reach)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from posenc_lab.positional import AttentionInputs
from posenc_lab.positional.path import path_scores
from tests.positional.naive import (
    _seed,  # noqa: F401 - an autouse fixture
    assert_equals_naive,
    new_inputs,
    path_per_pair,
)
from tests.positional.test_schemes import DH, B, H, inputs, make_positions, make_scheme
from tests.schemes import PATH


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


def test_documented_options_exist():
    from posenc_lab.positional import scheme_options

    assert scheme_options(PATH) == {"w_rank": 32, "short_conv": True}


@pytest.mark.parametrize(
    "options, match",
    [
        ({"w_rank": 0}, r"path: posenc.w_rank must be an integer >= 1 or null .*got 0"),
        ({"short_conv": "yes"}, r"path: posenc.short_conv must be true or false, got 'yes'"),
    ],
)
def test_bad_options_raise_naming_the_value(options, match):
    with pytest.raises(ValueError, match=match):
        make_scheme(PATH, **options)


def test_without_the_layer_input_it_says_what_it_needs():
    from tests.positional.test_schemes import qkv

    q, k, v = qkv(5, 3)
    with pytest.raises(ValueError, match=rf"{PATH}: .*layer's input.*context"):
        make_scheme(PATH).attend(AttentionInputs(0, q, k, make_positions(5, 3), v=v))
