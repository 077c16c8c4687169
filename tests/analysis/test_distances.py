"""The frequency of training distances (analysis/distances.py) against pairs counted one by one from the model's own
visibility mask and a static memory's valid slots, segment by segment through an episode."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posenc_lab_analysis.distances import distance_counts, frequency_table, summary
from tests.models import make_model
from tests.schemes import ROPE


def counted(L: int, M: int, T: int | None, same_length: bool) -> np.ndarray:
    """Pairs by distance from ``MemoryTransformer.positions`` (visible and valid keys), over one episode's segments
    (one segment with a full memory where T is None)."""
    model = make_model(ROPE, mem_len=M, same_length=same_length) if M else make_model(ROPE)
    counts = np.zeros(M + L, dtype=np.int64)
    for t in range(T // L if T else 1):
        filled = M if T is None else min(M, t * L)
        valid = torch.cat([torch.arange(M) >= M - filled, torch.ones(L, dtype=torch.bool)])
        pos = model.positions(L, M, torch.zeros(1, dtype=torch.long), torch.device("cpu"), valid=valid)
        d = pos.distance[pos.visible]
        counts += np.bincount(d.numpy(), minlength=M + L)
    return counts


@pytest.mark.parametrize("L, M, T, same_length", [(8, 0, None, False), (8, 8, 32, False), (8, 12, 40, False),
                                                  (8, 8, None, False), (8, 8, 32, True)])  # fmt: skip
def test_counts_equal_the_pairs_the_model_sees(L, M, T, same_length):
    window = M + 1 if same_length else None  # the default same_length_keys: mem_len + 1
    np.testing.assert_array_equal(distance_counts(L, M, T, window), counted(L, M, T, same_length))


def test_without_memory_count_falls_by_one_per_distance_and_the_summary_reads_it():
    assert list(distance_counts(4, 0, None)) == [4, 3, 2, 1]
    freq = frequency_table({"a:nomem": (4, 0, None, None), "a:mem4": (4, 4, 16, None)})
    table = summary(freq, {"a:nomem": 4, "a:mem4": 4}).set_index("cell")
    assert table.loc["a:nomem", "share_at_or_past_L"] == 0 and table.loc["a:nomem", "largest_vs_0"] == 0.25
    mem = distance_counts(4, 4, 16)
    assert table.loc["a:mem4", "share_at_or_past_L"] == pytest.approx(mem[4:].sum() / mem.sum())
    assert 0 < table.loc["a:mem4", "largest_vs_0"] < 1
