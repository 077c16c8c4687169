"""posenc_lab.data: ordered segment streams, pystdlib, recall, textfile, hf, the registry (the split by family and
textdir: test_families.py)."""

import itertools
import json
import os
import pickle
import re
import shutil
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import posenc_lab.data.families as family_split
from posenc_lab.data import CORPUS_NAMES, SegmentStream, load_corpus, make_recall
from posenc_lab.data.cache import DIGEST, CacheContentError
from posenc_lab.data.families import FILE_SEPARATOR
from posenc_lab.data.pystdlib import stdlib_files
from posenc_lab.rundir import corpus_identity

KEYS = {"tokens", "targets", "loss_mask", "offset", "reset", "distance"}


def positions(n):
    """Token i has value i, so a batch shows exactly which positions it covers."""
    return np.arange(n, dtype=np.int64)


def batches(stream, n=None):
    return list(itertools.islice(iter(stream), n))


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------- ordered streams


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


# ---------------------------------------------------------------- registry, textfile (hf: test_hf.py)


def test_unknown_corpus_lists_the_valid_names():
    assert {"pystdlib", "recall", "enwik8", "text8", "wikitext103", "wikitext2", "textfile", "hf"} <= set(CORPUS_NAMES)
    with pytest.raises(ValueError, match=r"unknown corpus 'nope'; valid: .*enwik8.*pystdlib.*recall"):
        load_corpus("nope")


def test_textfile_splits_by_position(tmp_path):
    content = bytes(range(256)) * 40  # 10,240 bytes
    (tmp_path / "t.txt").write_bytes(content)
    c = load_corpus("textfile", root=tmp_path, path=tmp_path / "t.txt")
    assert (c.vocab_size, c.unit) == (256, "byte")
    assert (len(c.train), len(c.val), len(c.test)) == (9216, 512, 512)
    assert bytes(c.train) + bytes(c.val) + bytes(c.test) == content
    c = load_corpus("textfile", root=tmp_path, path=tmp_path / "t.txt", split=(0.5, 0.25, 0.25))
    assert bytes(c.val) == content[5120:7680]


def test_textfile_too_small_for_the_split(tmp_path):
    (tmp_path / "t.txt").write_bytes(b"0123456789")
    with pytest.raises(ValueError, match=r"t\.txt \(data\.corpus\.path\) is too small: 10 bytes cannot be split"):
        load_corpus("textfile", root=tmp_path, path=tmp_path / "t.txt")


def test_textfile_is_read_from_a_copy_that_follows_the_file(tmp_path):
    """Runs map the cache's copy, never the user's file (one that shrinks under a memory map kills with SIGBUS); a
    changed file is copied again into the same entry, and a corpus already loaded keeps its data."""
    rng = np.random.default_rng(0)
    first, second = (rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (10_240, 20_480))
    (tmp_path / "t.txt").write_bytes(first)
    before = load_corpus("textfile", root=tmp_path / "cache", path=tmp_path / "t.txt")
    assert Path(before.train.filename).is_relative_to(tmp_path / "cache")
    (tmp_path / "t.txt").write_bytes(second)
    after = load_corpus("textfile", root=tmp_path / "cache", path=tmp_path / "t.txt")
    assert bytes(after.train) == second[:18_432] and bytes(before.train) == first[:9216]
    assert len(list((tmp_path / "cache" / "textfile").iterdir())) == 1  # the copy of that path replaced, not added


def test_textfile_same_size_text_with_its_mtime_kept_is_copied_again(tmp_path):
    """Issue 37: the copy was keyed on size and modification time, so ``cp -p`` of other text of the same size
    left runs on the old copy, with the old corpus hash."""
    text = tmp_path / "t.txt"
    text.write_bytes(bytes(range(97, 123)) * 400)
    before = load_corpus("textfile", root=tmp_path / "cache", path=text)
    sha, stamp = corpus_identity(before)["sha256"], text.stat()
    text.write_bytes(bytes(range(65, 91)) * 400)  # the same length, other bytes, its time put back
    os.utime(text, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    after = load_corpus("textfile", root=tmp_path / "cache", path=text)
    assert bytes(after.train) == (bytes(range(65, 91)) * 400)[: len(after.train)]
    assert corpus_identity(after)["sha256"] != sha


def test_textfile_missing_file_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="no file at .*missing.txt"):
        load_corpus("textfile", root=tmp_path, path=tmp_path / "missing.txt")


# ---------------------------------------------------------------- pystdlib


def _source(i: int) -> str:
    """A module of its own: lines no other module has (so no 32-byte window is shared by accident)."""
    return "".join(f"value_{i}_{k} = {i * 7919 + k * 104729}  # module {i}, line {k}\n" for k in range(i % 7 + 3))


@pytest.fixture
def fake_stdlib(tmp_path):
    root = tmp_path / "lib"
    root.mkdir()
    for i in range(60):  # 60 top-level modules, each its own family
        (root / f"mod{i}.py").write_text(_source(i))
    for i in range(3):  # a package: one family
        (root / "pkg" / f"part{i}.py").parent.mkdir(exist_ok=True)
        (root / "pkg" / f"part{i}.py").write_text(_source(100 + i))
    table = "".join(f"    {k:#06x}: {k * 31 % 65536:#06x},  # generated code table entry\n" for k in range(200))
    (root / "codec_a.py").write_text("# codec a\n" + table)  # near-duplicates in different places
    (root / "codec_b.py").write_text("# codec b, another table of the same generator\n" + table)
    for skipped in ("test/test_a.py", "site-packages/foo.py", "__pycache__/a.py", "pkg0/tests/t.py"):
        (root / skipped).parent.mkdir(parents=True, exist_ok=True)
        (root / skipped).write_text("skip me\n")
    (root / "notes.txt").write_text("not python\n")
    return root


def manifest(root):
    (path,) = (root / "pystdlib").glob("*/manifest.json")
    return json.loads(path.read_text())


def test_pystdlib_split_is_by_family_disjoint_and_exact(tmp_path, fake_stdlib):
    c = load_corpus("pystdlib", root=tmp_path / "cache", stdlib_dir=fake_stdlib)
    files = manifest(tmp_path / "cache")["info"]["files"]
    assert sum(map(len, files.values())) == 65 and all(files.values())
    split_of = {f: s for s, names in files.items() for f in names}
    assert len({split_of[f"pkg/part{i}.py"] for i in range(3)}) == 1  # a package stays together
    assert split_of["codec_a.py"] == split_of["codec_b.py"]  # near-duplicates found by overlap stay together
    assert not any(set(files[a]) & set(files[b]) for a, b in [("train", "val"), ("train", "test"), ("val", "test")])
    assert all(f.endswith(".py") and "tests" not in f and "test/" not in f for f in sum(files.values(), []))
    for split in ("train", "val", "test"):
        expect = b"".join((fake_stdlib / f).read_bytes() + FILE_SEPARATOR for f in files[split])
        assert bytes(getattr(c, split)) == expect
    with_tests = stdlib_files(fake_stdlib, include_tests=True)
    assert "test/test_a.py" in with_tests and "site-packages/foo.py" not in with_tests


def test_pystdlib_cached_second_load_is_identical(tmp_path, fake_stdlib, monkeypatch):
    a = load_corpus("pystdlib", root=tmp_path, stdlib_dir=fake_stdlib)
    monkeypatch.setattr(family_split, "families", lambda *a: pytest.fail("second load rebuilt the corpus"))
    b = load_corpus("pystdlib", root=tmp_path, stdlib_dir=fake_stdlib)
    assert isinstance(b.train, np.memmap)
    assert all(np.array_equal(getattr(a, s), getattr(b, s)) for s in ("train", "val", "test"))


def test_pystdlib_real_stdlib_capped(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_LAB_CACHE", str(tmp_path / "env"))  # the default root honours the env
    c = load_corpus("pystdlib", max_bytes=200_000)
    d = load_corpus("pystdlib", root=tmp_path / "other", max_bytes=200_000)
    assert (c.vocab_size, c.unit) == (256, "byte") and c.train.dtype == np.uint8
    assert (len(c.train), len(c.val), len(c.test)) == (170_000, 10_000, 20_000)
    assert all(np.array_equal(getattr(c, s), getattr(d, s)) for s in ("train", "val", "test"))
    assert b"def " in bytes(c.train) and b"import " in bytes(c.val)
    files = manifest(tmp_path / "env")["info"]["files"]
    assert not set(files["train"]) & set(files["val"])
    assert len(stdlib_files(Path(sysconfig.get_paths()["stdlib"]))) > 300


# ---------------------------------------------------------------- the cache, checked by content

RECALL_SMALL = dict(train_tokens=5000, eval_tokens=1000, max_distance=20)


@pytest.mark.parametrize("name", ["train.npy", "val.distance.npy", "vocab.txt"])
def test_a_cache_file_with_other_content_is_refused_naming_it_and_the_folder_to_delete(tmp_path, name):
    first = load_corpus("recall", root=tmp_path, **RECALL_SMALL)
    reference, itos = corpus_identity(first), first.itos  # before the edit below, which its memmaps would see
    (path,) = tmp_path.rglob(name)
    content = bytearray(path.read_bytes())
    content[len(content) // 2] ^= 1  # one bit: the file still reads, at its length
    path.write_bytes(bytes(content))
    message = rf"corpus cache file {re.escape(str(path))} is not the file posenc-lab wrote there \({DIGEST} "
    with pytest.raises(CacheContentError, match=message + rf".*Delete {re.escape(str(path.parent))} to prepare"):
        load_corpus("recall", root=tmp_path, **RECALL_SMALL)
    shutil.rmtree(path.parent)  # what the message says to do
    again = load_corpus("recall", root=tmp_path, **RECALL_SMALL)
    assert corpus_identity(again) == reference and again.itos == itos


def test_a_cache_without_digests_is_prepared_again_to_the_same_tokens(tmp_path, fake_stdlib, caplog):
    """An entry of an older posenc-lab cannot be vouched for: it is built again, never adopted, and its tokens (so
    the corpus hash of run.json) are those of the same source."""
    reference = corpus_identity(load_corpus("pystdlib", root=tmp_path, stdlib_dir=fake_stdlib))
    (path,) = tmp_path.rglob("manifest.json")
    old = json.loads(path.read_text())
    path.write_text(json.dumps({k: v for k, v in old.items() if k != DIGEST}))
    (train,) = tmp_path.rglob("train.npy")
    np.save(train, np.load(train)[::-1])  # content that only a check would catch
    with caplog.at_level("WARNING", logger="posenc_lab.data"):
        again = load_corpus("pystdlib", root=tmp_path, stdlib_dir=fake_stdlib)
    assert f"corpus cache {path.parent} has no content digests" in caplog.text
    assert corpus_identity(again) == reference and json.loads(path.read_text()) == old


# ---------------------------------------------------------------- recall


def test_recall_answers_the_planted_value_at_its_distance():
    n_filler, n_values = 32, 16
    marker = n_filler + n_values
    tokens, mask, dist = make_recall(50_000, seed=1, min_distance=2, max_distance=80)
    answers = np.flatnonzero(mask)
    assert len(answers) > 500
    assert np.array_equal(mask, dist >= 0)  # distance exactly where the loss counts
    assert np.array_equal(answers, np.flatnonzero(tokens == marker) + 1)  # every marker is answered next
    D = dist[answers]
    assert D.min() == 2 and D.max() == 80
    assert np.array_equal(tokens[answers - 1 - D], tokens[answers])  # the value planted D before the marker
    assert ((tokens[answers] >= n_filler) & (tokens[answers] < marker)).all()
    is_value = (tokens >= n_filler) & (tokens < marker)
    for a, d in zip(answers[:200], D[:200]):
        assert not is_value[a - d : a - 1].any()  # only filler between the plant and the marker


def test_recall_has_one_value_in_flight():
    tokens, mask, _ = make_recall(20_000, seed=2)
    is_value = (tokens >= 32) & (tokens < 48)
    answers = np.flatnonzero(mask)
    for a, b in zip(answers, answers[1:]):
        assert is_value[a + 1 : b].sum() == 1  # exactly one plant between two answers
    assert is_value[: answers[0]].sum() == 1


def test_recall_is_deterministic_and_validates():
    a = make_recall(5_000, seed=[3, 0])
    assert all(np.array_equal(x, y) for x, y in zip(a, make_recall(5_000, seed=[3, 0])))
    assert not np.array_equal(a[0], make_recall(5_000, seed=[3, 1])[0])
    with pytest.raises(ValueError, match="min_distance 9, max_distance 3"):
        make_recall(5_000, min_distance=9, max_distance=3)


def test_recall_corpus_streams_carry_mask_and_distance(tmp_path):
    c = load_corpus("recall", root=tmp_path, train_tokens=20_000, eval_tokens=20_000, eval_max_distance=120)
    assert c.vocab_size == 49 and c.itos[-1] == "?" and c.unit == "word"
    assert c.side["val"]["distance"].max() > 80 >= c.side["train"]["distance"].max()
    s = c.stream("train", 32, 4)
    assert isinstance(s.data, np.memmap)
    answered = 0
    for b in s:
        m = b["loss_mask"]
        answered += int(m.sum())
        assert ((b["targets"][m] >= 32) & (b["targets"][m] < 48)).all()
        assert (b["distance"][m] >= 2).all() and (b["distance"][~m] == -1).all()
    assert answered > 100


def test_recall_evaluation_range_is_its_own_and_its_far_items_were_never_trained(tmp_path):
    # the retrieval-reach setting (conf/experiment/reach.yaml): train 2..48, evaluate 2..400
    c = load_corpus(
        "recall", root=tmp_path, train_tokens=60_000, eval_tokens=60_000, max_distance=48, eval_max_distance=400
    )
    near = load_corpus("recall", root=tmp_path, train_tokens=60_000, eval_tokens=60_000, eval_min_distance=60)
    for split in ("val", "test"):
        mask, dist = near.side[split]["loss_mask"], near.side[split]["distance"]
        assert dist[mask].min() >= 60 and dist[mask].max() <= 80  # eval_min_distance moves the range's low end

    def items(split):
        """(planted index, distance) of every answer, each checked to answer the value planted D tokens back."""
        tokens, mask, dist = (
            np.asarray(x) for x in (c.split(split), c.side[split]["loss_mask"], c.side[split]["distance"])
        )
        answers = np.flatnonzero(mask)
        assert (dist[answers] >= 2).all() and (dist[~mask] == -1).all()
        # the value planted D tokens before the query marker
        assert np.array_equal(tokens[answers - 1 - dist[answers]], tokens[answers])
        assert (tokens[answers - 1] == c.vocab_size - 1).all()  # right after the query marker
        return tokens, answers, dist[answers]

    train_tokens, train_answers, train_d = items("train")
    assert train_d.min() == 2 and train_d.max() == 48
    windows = {tuple(train_tokens[a - 1 - d : a + 1]) for a, d in zip(train_answers, train_d)}
    for split in ("val", "test"):
        tokens, answers, d = items(split)
        assert d.max() > 384 and (d > 48).mean() > 0.8  # to 8 (L + M) of the reach preset, mostly unseen distances
        # the splits are drawn apart: no evaluation item (plant, filler, marker, answer) is a training item (one of
        # a few tokens can repeat one by chance: 16 x 32 items of D = 2 exist)
        assert (d >= 6).sum() > 100 and not windows & {
            tuple(tokens[a - 1 - k : a + 1]) for a, k in zip(answers, d) if k >= 6
        }
    with pytest.raises(ValueError, match=r"data.corpus.eval_min_distance=90 is above data.corpus.max_distance=80"):
        load_corpus("recall", root=tmp_path, eval_min_distance=90)


# ---------------------------------------------------------------- verbatim overlap between splits


def test_shared_context_matches_a_brute_force_search():
    from posenc_lab.data.overlap import shared_context

    rng = np.random.default_rng(0)
    train = rng.integers(0, 4, 3000).astype(np.uint8)
    scored = np.concatenate([train[100:400], rng.integers(0, 4, 300).astype(np.uint8)])
    got = shared_context(train, scored, window=6)
    seen = {bytes(train[i : i + 6]) for i in range(len(train) - 5)}
    want = [t >= 6 and bytes(scored[t - 6 : t]) in seen for t in range(len(scored))]
    assert got.tolist() == want and got[6:300].all()
