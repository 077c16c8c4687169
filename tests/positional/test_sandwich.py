"""Sandwich (posenc_lab/positional/sandwich.py): its bias from the sinusoids' dot product, its options. Against
the per-pair reference: tests/positional/test_references.py."""

from __future__ import annotations

import pytest
import torch

from posenc_lab.positional import scheme_options
from tests.positional.naive import _seed, new_scheme  # noqa: F401 - _seed: an autouse fixture
from tests.positional.test_schemes import H, make_scheme
from tests.schemes import SANDWICH


def test_documented_options_exist():
    assert scheme_options(SANDWICH) == {"dim": None}


def test_a_dimension_that_is_not_even_is_refused_naming_it():
    with pytest.raises(ValueError, match="dim .*even integer >= 2, got 7"):
        make_scheme(SANDWICH, dim=7)


def test_the_bias_starts_at_zero_is_negative_after_and_ripples():
    """b(0) = 0 and b(d) < 0 for d > 0, every head; a sum of cosines, so not monotone: with d_bar = 4 channels,
    head 1's bias is (cos(d) + cos(d / 100) - 2) / (8 / H)."""
    d = torch.arange(0, 12.0)
    bias = new_scheme(SANDWICH).table(d)
    assert (bias[:, 0] == 0).all() and (bias[:, 1:] < 0).all()
    assert not (bias.diff(dim=-1) < 0).all()
    torch.testing.assert_close(make_scheme(SANDWICH).table(d)[0], (torch.cos(d) + torch.cos(d / 100) - 2) / (8 / H))
