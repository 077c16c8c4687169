"""Ordered segment streams (posenc_lab/data/streams.py): contiguous, consecutive,
episodes and variable lengths, resume, DDP shards, workers, and clear errors."""

import itertools
import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from posenc_lab.data import SegmentStream

KEYS = {"tokens", "targets", "loss_mask", "offset", "reset", "distance"}


def positions(n):
    """Token i has value i, so a batch shows exactly which positions it covers."""
    return np.arange(n, dtype=np.int64)


def batches(stream, n=None):
    return list(itertools.islice(iter(stream), n))


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_batch_contract_shapes_and_dtypes():
    b = next(iter(SegmentStream(positions(1000), 16, 4)))
    assert set(b) == KEYS
    assert b["tokens"].shape == b["targets"].shape == b["loss_mask"].shape == b["distance"].shape == (4, 16)
    assert b["tokens"].dtype == b["targets"].dtype == b["offset"].dtype == b["distance"].dtype == torch.long
    assert b["loss_mask"].dtype == b["reset"].dtype == torch.bool
    assert b["offset"].shape == (4,) and b["reset"].shape == ()
    assert b["loss_mask"].all() and (b["distance"] == -1).all()


def test_streams_are_contiguous_consecutive_and_cover_the_data():
    N, B, L = 1003, 4, 16
    S = (N - 1) // B
    out = batches(SegmentStream(positions(N), L, B))
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, N)
    for b in batches(SegmentStream(data, L, B)):
        assert torch.equal(b["targets"][:, :-1], b["tokens"][:, 1:])  # targets = tokens shifted by one
    for prev, nxt in zip(out, out[1:]):
        assert torch.equal(nxt["tokens"][:, 0], prev["targets"][:, -1])  # next segment continues the stream
    tokens = torch.cat([b["tokens"] for b in out], dim=1)
    targets = torch.cat([b["targets"] for b in out], dim=1)
    expect = torch.arange(B)[:, None] * S + torch.arange(S)
    assert torch.equal(tokens, expect) and torch.equal(targets, expect + 1)
    assert [b["tokens"].shape[1] for b in out] == [L] * (S // L) + [S % L]  # last segment shorter


def test_episodes_reset_offsets_and_segments_never_cross_them():
    N, B, L, T = 2001, 2, 16, 40  # T not a multiple of L, S = 1000 not a multiple of T
    S = (N - 1) // B
    out = batches(SegmentStream(positions(N), L, B, episode_len=T))
    assert out[0]["reset"]  # the very first batch starts an episode
    for b in out:
        pos = b["tokens"][:, 0] - torch.arange(B) * S  # position in the stream
        assert torch.equal(b["offset"], pos % T)
        assert bool(b["reset"]) == (int(b["offset"][0]) == 0)
        assert int(b["offset"][0]) + b["tokens"].shape[1] <= T  # no segment crosses an episode
    assert sum(bool(b["reset"]) for b in out) == -(-S // T)
    assert [b["tokens"].shape[1] for b in out[:3]] == [16, 16, 8]


def test_one_episode_per_stream_counts_offsets_from_stream_start():
    out = batches(SegmentStream(positions(801), 10, 4))
    assert [int(b["offset"][0]) for b in out] == list(range(0, 200, 10))
    assert [bool(b["reset"]) for b in out] == [True] + [False] * 19


def test_cycling_stream_wraps_with_reset_and_has_no_len():
    stream = SegmentStream(positions(81), 10, 2, cycle=True)  # S = 40: 4 steps per pass
    out = batches(stream, 9)
    assert [bool(b["reset"]) for b in out] == [True, False, False, False] * 2 + [True]
    assert all(same(a, b) for a, b in zip(out[:4], out[4:8]))
    with pytest.raises(TypeError, match="infinite"):
        len(stream)


def test_variable_lengths_are_deterministic_bounded_and_vary():
    def lengths(seed, **kw):
        s = SegmentStream(positions(20001), 32, 4, var_len=True, seed=seed, **kw)
        return [b["tokens"].shape[1] for b in batches(s)]

    a = lengths(0)
    assert a == lengths(0) and a != lengths(1)
    assert min(a[:-1]) >= 5 and max(a) <= 32
    assert a.count(32) > len(a) / 3 and sum(1 for n in a if n < 24) > 0  # some L/2 draws
    b = lengths(0, min_len=20, max_len=40)
    assert 20 <= min(b[:-1]) and max(b) <= 40 and max(b) > 32


def test_var_len_with_episodes_still_respects_episode_boundaries():
    s = SegmentStream(positions(20001), 32, 4, var_len=True, episode_len=50, cycle=True)
    for b in batches(s, 300):
        assert int(b["offset"][0]) + b["tokens"].shape[1] <= 50
        assert bool(b["reset"]) == (int(b["offset"][0]) == 0)


@pytest.mark.parametrize("kw", [dict(), dict(var_len=True, episode_len=45), dict(cycle=True, var_len=True)])
def test_resume_from_batch_k_equals_continuing(kw):
    full = batches(SegmentStream(positions(3001), 20, 3, **kw), 120)
    for k in (1, 7, len(full) - 1):
        resumed = batches(SegmentStream(positions(3001), 20, 3, start_batch=k, **kw), 120 - k)
        assert len(resumed) == len(full) - k
        assert all(same(a, b) for a, b in zip(full[k:], resumed))


def test_state_dict_round_trip_and_mismatch():
    a = SegmentStream(positions(3001), 20, 3, start_batch=11)
    b = SegmentStream(positions(3001), 20, 3)
    b.load_state_dict(a.state_dict())
    assert b.start_batch == 11 and len(b) == len(a) == 50 - 11
    assert same(next(iter(a)), next(iter(b)))
    with pytest.raises(ValueError, match="segment_len 20 vs 25"):
        SegmentStream(positions(3001), 25, 3).load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="start_batch must be <= 50"):
        SegmentStream(positions(3001), 20, 3, start_batch=51)


@pytest.mark.parametrize("world_size", [2, 4])
def test_ddp_shards_are_disjoint_and_concatenate_to_the_global_batch(world_size):
    kw = dict(episode_len=30, var_len=True, seed=3)
    glob = batches(SegmentStream(positions(4001), 16, 8, **kw))
    ranks = [
        batches(SegmentStream(positions(4001), 16, 8, rank=r, world_size=world_size, **kw)) for r in range(world_size)
    ]
    assert all(len(r) == len(glob) for r in ranks)  # every rank yields the same number of steps
    for t, g in enumerate(glob):
        parts = [r[t] for r in ranks]
        for k in ("tokens", "targets", "loss_mask", "offset", "distance"):
            assert torch.equal(torch.cat([p[k] for p in parts]), g[k])
        assert all(torch.equal(p["reset"], g["reset"]) for p in parts)
    seen = [set(torch.cat([b["tokens"] for b in r], 1).flatten().tolist()) for r in ranks]
    assert all(not (seen[i] & seen[j]) for i in range(world_size) for j in range(i))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(segment_len=0), r"segment_len must be >= 1, got 0"),
        (dict(n_streams=0), r"n_streams must be >= 1, got 0"),
        (dict(episode_len=8), r"episode_len must be None or >= segment_len \(16\), got 8"),
        (dict(n_streams=100), r"too few tokens: 1000 tokens .*need >= n_streams \* segment_len \+ 1 = 1601"),
        (dict(world_size=3), r"n_streams \(the global batch\) 4 is not divisible by world_size 3"),
        (dict(rank=2, world_size=2), r"0 <= rank < world_size, got rank 2"),
        (dict(var_len=True, min_len=10, max_len=5), r"min_len 10, max_len 5"),
        (dict(start_batch=-1), r"start_batch must be >= 0, got -1"),
        (dict(loss_mask=np.ones(10, bool)), r"loss_mask has 10 entries but data has 1000 tokens"),
    ],
)
def test_bad_stream_settings_raise_clear_errors(kwargs, match):
    args = dict(data=positions(1000), segment_len=16, n_streams=4) | kwargs
    with pytest.raises(ValueError, match=match):
        SegmentStream(**args)


def test_non_integer_data_is_rejected():
    with pytest.raises(ValueError, match="1-D integer token array"):
        SegmentStream(np.zeros(100), 4, 2)


def test_dataloader_workers_keep_the_order():
    s = SegmentStream(positions(5001), 16, 4, episode_len=40, var_len=True)
    single = list(DataLoader(s, batch_size=None))
    multi = list(DataLoader(s, batch_size=None, num_workers=2))
    assert len(single) == len(multi) == len(s)
    assert all(same(a, b) for a, b in zip(single, multi))


def test_memmap_stream_pickles_as_a_path_not_the_data(tmp_path):
    np.save(tmp_path / "t.npy", np.random.default_rng(0).integers(0, 256, 200_000).astype(np.uint8))
    s = SegmentStream(np.load(tmp_path / "t.npy", mmap_mode="r"), 32, 8)
    blob = pickle.dumps(s)
    assert len(blob) < 5_000
    t = pickle.loads(blob)
    assert isinstance(t.data, np.memmap)
    assert all(same(a, b) for a, b in zip(batches(s, 5), batches(t, 5)))


def test_side_arrays_are_taken_at_target_positions():
    n = 401
    mask = np.arange(n) % 7 == 0
    dist = np.where(mask, np.arange(n) % 50, -1)
    for b in batches(SegmentStream(positions(n), 10, 4, loss_mask=mask, distance=dist)):
        assert torch.equal(b["loss_mask"], b["targets"] % 7 == 0)
        assert torch.equal(b["distance"], torch.where(b["loss_mask"], b["targets"] % 50, -1))
