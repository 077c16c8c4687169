"""CoPE (posenc_lab/positional/cope.py): the count of visible gates and its
maximum."""

from __future__ import annotations

import pytest
import torch

from tests.positional.naive import (
    _seed,  # noqa: F401 - an autouse fixture
    new_scheme,
)
from tests.positional.test_schemes import DH, B, H, make_positions, make_scheme, qkv
from tests.schemes import COPE


@pytest.mark.parametrize("max_position, same_length", [(20, False), (20, True), (2, False)])
def test_cope_counts_the_visible_gates_and_clamps_at_its_maximum(max_position, same_length):
    """q . k = 0 makes every gate sigmoid(0) = 1/2, and e[n] = n along q reads the count itself: the score of
    (i, j) is p_ij = (keys i sees from j to i) / 2, memory included, clamped at max_position."""
    scheme, (L, M) = new_scheme(COPE, max_position=max_position), (4, 3)
    pos, (_, k, _) = make_positions(L, M, same_length), qkv(L, M)
    q = torch.zeros(B, H, L, DH)
    q[..., 0], k[..., 0] = 1.0, 0.0
    with torch.no_grad():
        scheme.embedding.zero_()
        scheme.embedding[0, :, 0] = torch.arange(max_position + 1.0)
        scores = scheme.scores(0, q, k, pos)
    seen = pos.visible.flip(-1).cumsum(-1).flip(-1)  # keys visible from j to i
    want = (seen / 2).clamp(max=max_position).expand(B, H, L, L + M)
    torch.testing.assert_close(scores[..., pos.visible], want[..., pos.visible])
    assert scores.max() == min(max_position, (M + 1 if same_length else M + L) / 2)


def test_cope_max_position_error_or_clamp():
    """overflow=error refuses, before compute, lengths whose counts could pass max_position; clamp serves them."""
    with pytest.raises(ValueError, match=r"count up to 12 keys.*max_position=8.*at least 12.*overflow=clamp"):
        new_scheme(COPE, max_position=8, overflow="error").validate(segment_len=4, mem_len=8)
    new_scheme(COPE, max_position=8).validate(segment_len=4, mem_len=8)
    for options, match in [
        ({"max_position": 0}, "max_position must be an integer >= 1, got 0"),
        ({"max_position": 8, "overflow": "wrap"}, "overflow must be one of clamp, error, got 'wrap'"),
        ({"max_position": None}, "max_position=None must be sized"),
    ]:
        with pytest.raises(ValueError, match=match):
            make_scheme(COPE, **options)


def test_documented_options_exist():
    from posenc_lab.positional import scheme_options

    assert scheme_options(COPE) == {"max_position": None, "overflow": "clamp"}
