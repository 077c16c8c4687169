"""Stick-breaking attention (posenc_lab/positional/stickbreaking.py): the
nearest key breaks the stick first and the rest is left over."""

from __future__ import annotations

import pytest
import torch

from posenc_lab.positional import AttentionInputs
from tests.positional.naive import _seed  # noqa: F401 - an autouse fixture
from tests.positional.test_schemes import DH, B, H, make_positions, make_scheme, qkv
from tests.schemes import STICKBREAKING


@pytest.mark.parametrize("attend_current", [False, True])
def test_stickbreaking_nearest_key_breaks_first_and_the_rest_is_left(attend_current):
    """One key with beta ~ 1 just before the query takes the whole stick: nothing reaches the keys behind it; with
    every beta ~ 0 the stick is left whole and the output is b_h."""
    scheme, (L, M) = make_scheme(STICKBREAKING, attend_current=attend_current), (3, 2)
    pos, (q, k, v) = make_positions(L, M), qkv(L, M)
    q = torch.ones(B, H, L, DH)
    k = torch.full_like(k, -50.0)  # beta ~ 0 everywhere
    with torch.no_grad():
        out = scheme.attend(AttentionInputs(0, q, k, pos, v=v))
        torch.testing.assert_close(out, scheme.remainder[0][None, :, None].expand_as(out))
        k[:, :, M + L - 2] = 50.0  # the last query's nearest other key: beta ~ 1
        probs = scheme.attention_probs(AttentionInputs(0, q, k, pos))
    row = probs[:, :, -1]
    own = M + L - 1
    assert torch.allclose(row[..., M + L - 2], torch.ones(B, H), atol=1e-6)
    assert (row[..., : M + L - 2] < 1e-6).all()
    assert torch.equal(row[..., own] == 0, torch.full((B, H), not attend_current))


def test_documented_options_exist():
    from posenc_lab.positional import scheme_options

    assert scheme_options(STICKBREAKING) == {"attend_current": False}


def test_a_bad_option_raises_naming_the_value():
    with pytest.raises(ValueError, match=r"stickbreaking: posenc.attend_current must be true or false, got 1"):
        make_scheme(STICKBREAKING, attend_current=1)
