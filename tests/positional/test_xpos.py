"""xPos (posenc_lab/positional/xpos.py): finite and exact far from the start, and
RoPE without its decay."""

from __future__ import annotations

import pytest
import torch

from posenc_lab.positional import AttentionInputs
from tests.positional.naive import _seed  # noqa: F401 - an autouse fixture
from tests.positional.test_schemes import make_positions, make_scheme, qkv
from tests.schemes import XPOS


def test_xpos_stays_finite_and_exact_far_from_the_start():
    """The decay factors are taken about the middle of the span: at positions 10^5 (zeta^{-j/B} alone would be
    0.29^{-195}, past fp32) the scores equal those at 0."""
    scheme, pos, (q, k, v) = make_scheme(XPOS), make_positions(5, 4), qkv(5, 4)
    with torch.no_grad():
        near, far = (
            scheme.attend(AttentionInputs(0, q, k, pos, v=v)),
            scheme.attend(AttentionInputs(0, q, k, pos.shifted(100_000), v=v)),
        )
    assert torch.isfinite(far).all()
    torch.testing.assert_close(far, near, atol=1e-4, rtol=1e-4)


def test_xpos_decays_with_the_distance_and_is_rope_without_it():
    """With q = k and no content difference, xPos's self-score falls faster with distance than RoPE's by
    exactly zeta^{d/B}; with gamma huge (zeta -> 1) it is RoPE."""
    from tests.schemes import ROPE

    pos, (q, k, v) = make_positions(5, 4), qkv(5, 4)
    rope, flat = make_scheme(ROPE), make_scheme(XPOS, gamma=1e9)
    with torch.no_grad():
        torch.testing.assert_close(
            flat.attend(AttentionInputs(0, q, k, pos, v=v)), rope.attend(AttentionInputs(0, q, k, pos, v=v))
        )
    zeta = make_scheme(XPOS).log_zeta.exp()
    assert zeta.min() == pytest.approx(0.4 / 1.4) and zeta.max() < 1


def test_documented_options_exist():
    from posenc_lab.positional import scheme_options

    assert scheme_options(XPOS) == {"base": 10000.0, "gamma": 0.4, "scale_base": 512.0}


@pytest.mark.parametrize(
    "options, match",
    [
        ({"gamma": -0.4}, "gamma must be a number > 0, got -0.4"),
        ({"scale_base": 0}, "scale_base must be a number > 0, got 0"),
    ],
)
def test_bad_options_raise_naming_the_value(options, match):
    with pytest.raises(ValueError, match=match):
        make_scheme(XPOS, **options)
