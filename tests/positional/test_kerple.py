"""KERPLE (posenc_lab/positional/kerple_log.py, kerple_power.py): the bounds of
its parameters are projections."""

from __future__ import annotations

import pytest
import torch

from tests.positional.naive import _seed, new_scheme  # noqa: F401 - _seed: an autouse fixture
from tests.positional.test_schemes import make_positions, make_scheme
from tests.schemes import KERPLE_LOG, KERPLE_POWER


@pytest.mark.parametrize("name", [KERPLE_LOG, KERPLE_POWER])
def test_kerple_constraints_are_projections(name):
    """r1, r2 >= 0.01 (power: r2 <= 2) as in the authors' code: an update that leaves the range is undone at the
    next forward, in place, and a graph still waiting for its backward stays valid."""
    scheme, pos = make_scheme(name), make_positions(5, 3)
    with torch.no_grad():
        scheme.r1.fill_(-1.0)
        scheme.r2.fill_(5.0)
    waiting = scheme.score_bias(0, pos).dense(pos).sum()  # projects: r1 = 0.01, r2 = 5 (log) or 2 (power)
    assert (scheme.r1 == 0.01).all() and (scheme.r2 == (2.0 if name == KERPLE_POWER else 5.0)).all()
    scheme.score_bias(1, pos).dense(pos)
    waiting.backward()
    assert scheme.r1.grad[0].abs().sum() > 0 and not scheme.r1.grad[1].any()


def test_documented_options_exist():
    from posenc_lab.positional import scheme_options

    assert scheme_options(KERPLE_LOG) == scheme_options(KERPLE_POWER) == {}


def test_biases_start_at_zero_and_fall_with_the_distance():
    """b(0) = 0 and b(d) < 0 for d > 0, every head, and the penalty grows with the distance."""
    d = torch.arange(0, 12.0)
    for name in (KERPLE_LOG, KERPLE_POWER):
        bias = new_scheme(name).bias(0, d)
        assert (bias[:, 0] == 0).all() and (bias[:, 1:] < 0).all(), name
        assert (bias.diff(dim=-1) < 0).all(), name
