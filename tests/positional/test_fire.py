"""FIRE (posenc_lab/positional/fire.py): a function of the distance below its
threshold, its query position, and its linear pieces against the MLP."""

from __future__ import annotations

import pytest
import torch

from tests.positional.naive import (
    _seed,  # noqa: F401 - an autouse fixture
    assert_equals_naive,
    new_scheme,
)
from tests.positional.test_schemes import (
    make_positions,
    make_scheme,
    qkv,
)
from tests.schemes import FIRE


def test_fire_below_its_threshold_is_a_function_of_the_distance():
    """In training (every query below L, the default) FIRE is translation invariant; past L it is not."""
    pos = make_positions(6, 4)
    for threshold, invariant in ((10.0, True), (2.0, False)):
        scheme = new_scheme(FIRE, init_threshold=threshold)
        with torch.no_grad():
            scheme.threshold.fill_(threshold)
            bias = scheme.score_bias(0, pos).dense(pos)  # [H, L, N]; distance 1: (i, M + i - 1)
        diagonal = torch.stack([bias[:, i, 4 + i - 1] for i in range(1, 6)], -1)
        assert torch.allclose(diagonal, diagonal[:, :1].expand_as(diagonal), atol=1e-6) is invariant


def test_fire_query_position_is_the_keys_it_sees():
    """i = the largest visible distance: M + i with a full memory, the window minus one with same-length."""
    scheme = new_scheme(FIRE)
    with torch.no_grad():
        scheme.c.fill_(1.0)
        scheme.threshold.fill_(1.0)
        x_full = scheme.inputs(0, make_positions(4, 5))
        x_window = scheme.inputs(0, make_positions(4, 5, same_length=True))
    # full memory: query i sees keys back to -M, its i is M + i; key column j sits at distance M + i - j
    i, j = torch.arange(4)[:, None], torch.arange(9)[None, :]
    want = torch.log1p((5 + i - j).clamp(min=0).float()) / torch.log1p(5.0 + i)
    torch.testing.assert_close(x_full, want)
    # same-length window of M + 1 = 6 keys: every query's i is 5 (its farthest key, column i, reads 1)
    visible = make_positions(4, 5, same_length=True).visible
    want = torch.log1p((5 + i - j).clamp(min=0).float()) / torch.log1p(torch.tensor(5.0))
    torch.testing.assert_close(x_window[visible], want.expand(4, 9)[visible])


def test_fire_pieces_are_the_mlp_at_ties_too():
    """The linear pieces equal the MLP run per pair, gradients included, when kinks sit exactly on inputs
    (the gpt2 init: first-layer biases 0, every kink at x = 0, the input of distance 0)."""
    scheme = new_scheme(FIRE).train()
    with torch.no_grad():
        for mlp in scheme.mlp:
            mlp[0].bias.zero_()
    q, k, v = (x.requires_grad_() for x in qkv(5, 3))
    assert_equals_naive(FIRE, scheme, q, k, v, make_positions(5, 3))


def test_documented_options_exist():
    from posenc_lab.positional import scheme_options

    assert scheme_options(FIRE) == {"width": 32, "init_c": 1.0, "init_threshold": None}


@pytest.mark.parametrize(
    "options, match",
    [
        ({"width": 0}, "width .*>= 1, got 0"),
        ({"init_c": 0.0}, "init_c must be a number >= 0.01, got 0.0"),
        ({"init_threshold": 0.5}, "init_threshold must be a number >= 1.0, got 0.5"),
    ],
)
def test_bad_options_raise_naming_the_value(options, match):
    with pytest.raises(ValueError, match=match):
        make_scheme(FIRE, **options)
