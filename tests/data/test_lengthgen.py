"""The length-generalization tasks (posenc_lab/data/lengthgen.py and its task modules): right answers, answer-only
scoring, the test lengths, no test input seen in training, the same data on every load, one-line option errors
before any work, and a task module found by discovery alone."""

from __future__ import annotations

import importlib.util
import re
import sys

import numpy as np
import pytest
import torch

from posenc_lab.checks import problems
from posenc_lab.data import CORPORA, CORPUS_UNITS, load_corpus
from posenc_lab.data.lengthgen import TASKS, eval_lengths, task_instances
from tests.helpers_train import compose_config, tiny

SMALL = dict(n_train=4, train_tokens=3000, eval_instances=16)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("lengthgen_cache")


def split_instances(corpus, split: str) -> list[tuple[list[int], list[int], np.ndarray]]:
    """(input, answer, scored mask) of every instance of a split, cut at its end tokens."""
    query, end = len(corpus.itos) - 2, len(corpus.itos) - 1
    return instances(corpus.split(split), corpus.side[split]["loss_mask"], query, end)


def instances(tokens, mask, query: int, end: int) -> list[tuple[list[int], list[int], np.ndarray]]:
    """(input, answer, scored mask) of every instance of a stretch that starts with one, cut at its end tokens."""
    tokens, mask = np.asarray(tokens), np.asarray(mask)
    out, start = [], 0
    for stop in np.flatnonzero(tokens == end):
        inst = tokens[start:stop].tolist()
        q = inst.index(query)
        out.append((inst[:q], inst[q + 1 :], mask[start : stop + 1]))
        start = stop + 1
    return out


def symbols(xs, corpus) -> str:
    return "".join(corpus.itos[x] for x in xs)


@pytest.mark.parametrize("task", ["copy", "reverse", "duplicate_string", "addition"])
def test_every_instance_has_its_answer_and_only_answers_are_scored(task, cache):
    c = load_corpus(task, root=cache, **SMALL)
    assert CORPUS_UNITS[task] == "word" and task in TASKS
    for split in ("train", "test"):
        instances = split_instances(c, split)
        assert len(instances) > 20
        for x, y, scored in instances:
            if task == "copy":
                assert y == x
            elif task == "reverse":
                assert y == x[::-1]
            elif task == "duplicate_string":
                assert y == x + x
            else:  # a + b, each of n digits, the sum in n + 1 digits
                a, b = symbols(x, c).split("+")
                assert len(a) == len(b) and symbols(y, c) == str(int(a) + int(b)).zfill(len(a) + 1)
            # scored: exactly the answer tokens (as targets), neither the input, the query nor the end token
            assert scored.tolist() == [False] * (len(x) + 1) + [True] * len(y) + [False]


@pytest.mark.parametrize("task", ["copy", "addition"])
def test_test_lengths_double_and_no_test_input_occurs_in_training(task, cache):
    # 4 symbols at n_train 4: 256 inputs, a quarter of them in training: drawing at random would repeat some
    options = dict(SMALL, n_symbols=4 if task == "copy" else 10, n_train=4 if task == "copy" else 2)
    options["eval_instances"] = 20 if task == "copy" else 24
    c = load_corpus(task, root=cache, **options)
    n = options["n_train"]
    train = {tuple(x) for x, _, _ in split_instances(c, "train")}
    assert max(len(x) for x in train) == (n if task == "copy" else 2 * n + 1)  # lengths up to n_train
    assert sum(len(x) == len(max(train, key=len)) for x in train) > 20  # training holds many of length n_train
    seen = set(train)
    for split in ("val", "test"):
        inputs = [tuple(x) for x, _, _ in split_instances(c, split)]
        assert not seen & set(inputs) and len(set(inputs)) == len(inputs)  # none seen, and val apart from test
        seen |= set(inputs)
        by_length = task_instances(c, split)
        assert sorted(by_length) == eval_lengths(n, 8) == [n, 2 * n, 4 * n, 8 * n]
        for length, (rows, scored, ids) in by_length.items():
            assert ids == {}  # no position ids unless asked for
            assert rows.shape[0] == options["eval_instances"] and rows[:, 0].tolist() == [len(c.itos) - 1] * len(rows)
            d = np.asarray(c.side[split]["distance"])
            assert set(d[d >= 0].tolist()) == set(by_length)  # distance: each answer's instance length
            answer = length if task == "copy" else length + 1  # the copy, or the sum's n + 1 digits
            assert scored.sum(1).tolist() == [answer] * len(rows)


def test_the_data_has_its_own_seed(cache):
    a, b = load_corpus("reverse", root=cache, **SMALL), load_corpus("reverse", root=cache, **SMALL)
    assert np.array_equal(a.train, b.train) and np.array_equal(a.test, b.test)
    other = load_corpus("reverse", root=cache, seed=1, **SMALL)
    assert not np.array_equal(a.test, other.test)
    # two tasks of one seed draw apart (the task's name is part of the seed)
    assert split_instances(load_corpus("copy", root=cache, **SMALL), "test")[0][0] != split_instances(a, "test")[0][0]


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(max_factor=3), "data.corpus.max_factor must be a power of 2 (the test lengths double), got 3"),
        (dict(min_len=9), "data.corpus.min_len=9 is above data.corpus.n_train=8"),
        (dict(n_symbols=1), "data.corpus.n_symbols must be an integer >= 2, got 1"),
        (dict(align_to_segment=-1), "data.corpus.align_to_segment must be an integer >= 0, got -1"),
        (dict(n_train=2, n_symbols=2), "data.corpus.n_symbols=2 gives 4 distinct inputs of length n_train=2, fewer"),
    ],
)
def test_bad_options_are_one_line_before_any_work(options, message, tmp_path):
    with pytest.raises(ValueError, match="^" + re.escape(f"copy corpus: {message}")) as e:
        load_corpus("copy", root=tmp_path, **options)
    assert "\n" not in str(e.value) and not any(tmp_path.iterdir())  # nothing generated, nothing cached
    cfg = compose_config("train", ["data=copy", "run_dir=x", "data.corpus.n_train=eight"])
    assert problems(cfg, "train") == ["data.corpus.n_train must be an integer, got 'eight'"]


def test_it_trains_with_answer_accuracy(cache, tmp_path):
    from posenc_lab.train import train

    corpus = ["data.corpus.train_tokens=4000", "data.corpus.eval_instances=8", "data.corpus.n_train=4"]
    results = train(compose_config("train", tiny(tmp_path / "run", cache, *corpus, steps=2, data="copy")))
    assert results["data"] == "copy" and 0 <= results["test"]["acc"] <= 1


SOURCE = '''
"""A throwaway task: the input's symbols sorted."""
import numpy as np
from posenc_lab.data.lengthgen import register_task


@register_task("throwaway_sort", space=lambda n, s: s**n)
def make_sort(rng, n, count, n_symbols):
    x = rng.integers(0, n_symbols, (count, n))
    return x, np.sort(x, axis=1)
'''


def test_a_task_module_is_found_by_discovery(tmp_path):
    module = tmp_path / "throwaway_sort.py"
    module.write_text(SOURCE)
    spec = importlib.util.spec_from_file_location("_test_task_throwaway_sort", module)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    try:
        spec.loader.exec_module(mod)
        c = load_corpus("throwaway_sort", root=tmp_path / "cache", **SMALL)
        assert "throwaway_sort" in TASKS and sorted(task_instances(c, "test")) == [4, 8, 16, 32]
        assert all(y == sorted(x) for x, y, _ in split_instances(c, "test"))
    finally:
        for registry in (CORPORA, CORPUS_UNITS, TASKS):
            registry.pop("throwaway_sort", None)
        sys.modules.pop(spec.name, None)


def aligned_and_packed(cache, L: int, **options):
    options = dict(SMALL, **options)
    return load_corpus("reverse", root=cache, align_to_segment=L, **options), load_corpus(
        "reverse", root=cache, **options
    )


@pytest.mark.parametrize("L, n_train", [(16, 4), (8, 4)])  # 8: an instance of 4 (10 tokens) spans two segments
def test_aligned_instances_start_every_segment_in_every_stream_with_the_same_answers(cache, L, n_train):
    aligned, packed = aligned_and_packed(cache, L, n_train=n_train)
    pad, end = aligned.itos.index("_"), aligned.document_separator
    assert aligned.vocab_size == packed.vocab_size + 1 and aligned.itos[end] == "." and pad == packed.vocab_size
    for split in ("train", "val", "test"):
        tokens, side = aligned.split(split), aligned.side[split]
        real = tokens != pad
        # the same instances in the same order, answers and scoring unchanged: only pads are added
        assert np.array_equal(tokens[real], packed.split(split))
        for k in ("loss_mask", "distance"):
            assert np.array_equal(side[k][real], packed.side[split][k])
        assert not side["loss_mask"][~real].any() and (side["distance"][~real] == -1).all()  # pads: no loss
        starts = np.flatnonzero(real & np.concatenate([[True], ~real[:-1] | (tokens[:-1] == end)]))
        assert len(starts) == (tokens == end).sum() and (starts % L == 0).all()
    for B in (3, 5):  # streams cut at multiples of L whatever the batch: (N - 1) // B need not be one
        stream, n_tokens = aligned.stream("train", L, B, cycle=False), len(aligned.train)
        assert stream.stream_len % L == 0 and (n_tokens - 1) // B % L != 0 or B == 5
        rows = [[] for _ in range(B)]
        for batch in stream:
            x, y, m = batch["tokens"].numpy(), batch["targets"].numpy(), batch["loss_mask"].numpy()
            inside = np.concatenate(
                [np.zeros((B, 1), bool), (x[:, 1:] < 4) & ((x[:, :-1] == end) | (x[:, :-1] == pad))], 1
            )
            assert not inside.any()  # no instance starts inside a segment: each begins one (or continues one)
            assert (x[:, 0] < aligned.vocab_size).all() and not m[y == pad].any()  # padding carries no loss
            for b in range(B):
                rows[b] += x[b].tolist()
        for b, row in enumerate(rows):  # each stream in corpus order: its memory is the true left context
            assert row == aligned.train[b * stream.stream_len : (b + 1) * stream.stream_len].tolist()
            starts = [i for i in range(len(row)) if row[i] < 4 and (i == 0 or row[i - 1] in (end, pad))]
            assert all(i % L == 0 for i in starts)


def test_aligned_test_instances_are_read_from_a_segments_first_position(cache):
    aligned, packed = aligned_and_packed(cache, 16)
    a, p = task_instances(aligned, "test"), task_instances(packed, "test")
    assert sorted(a) == sorted(p)
    for n in a:
        # packed: the end token, then the instance; aligned: the instance alone (as training put it, at position 0)
        assert np.array_equal(a[n][0], p[n][0][:, 1:]) and np.array_equal(a[n][1], p[n][1][:, 1:])
        assert not p[n][1][:, 0].any()  # the instance's first symbol is never scored: nothing is lost


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data.corpus.align_to_segment=16"], "data.corpus.align_to_segment=16 starts every instance at a multiple"),
        (["data.corpus.align_to_segment=32", "data.var_len=true"], "needs data.segment_len=32 equal to it"),
    ],
)
def test_a_bad_alignment_is_one_line_before_any_work(overrides, message, tmp_path):
    cfg = compose_config("train", ["data=reverse", "run_dir=x", *overrides])
    found = problems(cfg, "train")
    assert len(found) == 1 and message in found[0] and "\n" not in found[0], found
    with pytest.raises(ValueError, match=re.escape("data.segment_len=32 equal to it")):  # a stream made directly
        load_corpus("reverse", root=tmp_path, align_to_segment=16, **SMALL).stream("train", 32, 2)


# ---- fresh instances: drawn on the fly, never read twice by design --------------------------------------------


def fresh(align: int = 0, **options):
    """A fresh reverse corpus of 4 symbols (nothing is cached: the root is never read)."""
    return load_corpus(
        "reverse", root="unused", **dict(SMALL, n_symbols=4, fresh=True, align_to_segment=align, **options)
    )


def chunk_instances(corpus, tokens, mask, whole: bool = False) -> list[tuple[list[int], list[int], np.ndarray]]:
    """(input, answer, scored) of every instance of a stretch of tokens (pads dropped); ``whole``: the stretch begins
    with an instance, else its first one is left out (it may have begun before)."""
    tokens, mask = np.asarray(tokens), np.asarray(mask)
    if tokens[0] == corpus.document_separator:  # a packed chunk opens with the end token of the instance before
        tokens, mask = tokens[1:], mask[1:]
    end = corpus.document_separator
    keep = tokens < (end + 1)  # the pads out (aligned: the one token after the end token)
    return instances(tokens[keep], mask[keep], end - 1, end)[0 if whole else 1 :]


@pytest.mark.parametrize("align", [0, 8])
def test_fresh_instances_are_right_held_out_and_cover_the_training_lengths(align):
    c = fresh(align)
    chunk = c.train.chunk_tokens
    assert len(c.train) == SMALL["train_tokens"] and (align == 0 or chunk % align == 0)
    stretch = np.arange(5 * chunk, 7 * chunk)  # two chunks far along the split, past one pass
    tokens, mask = c.train[stretch], c.side["train"]["loss_mask"][stretch]
    instances = chunk_instances(c, tokens, mask)
    assert len(instances) > 200
    held = set()
    for split in ("val", "test"):
        inputs = chunk_instances(c, c.split(split), c.side[split]["loss_mask"], whole=True)
        held |= {tuple(x) for x, _, _ in inputs}
    assert len(held) == 2 * 4 * SMALL["eval_instances"]  # four test lengths, val apart from test
    for x, y, scored in instances:
        assert y == x[::-1] and scored.tolist() == [False] * (len(x) + 1) + [True] * len(y) + [False]
        assert tuple(x) not in held  # no training input is one of val's or test's
    assert {len(x) for x, _, _ in instances} == set(range(1, SMALL["n_train"] + 1))
    if align:  # every instance starts at a multiple of the segment: the chunk holds whole segments
        starts = np.flatnonzero((tokens < 4) & np.concatenate([[True], np.isin(tokens[:-1], [5, 6])]))
        assert (starts % align == 0).all()


def test_fresh_draws_depend_on_the_position_alone_and_differ_by_seed():
    a, b = fresh(), fresh()
    far, near = np.arange(10**9, 10**9 + 50), np.arange(0, 50)
    first = a.train[far]  # a far chunk drawn first, then the near one, in another corpus object the other way round
    assert np.array_equal(b.train[near], a.train[near]) and np.array_equal(b.train[far], first)
    assert not np.array_equal(fresh(seed=1).train[near], a.train[near])
    assert not np.array_equal(a.train[near], a.train[near + a.train.pass_stride])  # the next pass: other tokens


def test_a_cycling_stream_reads_new_instances_every_pass_and_resumes_exactly():
    c = fresh(train_tokens=2000)
    stream = c.stream("train", 16, 4, cycle=True)
    S = stream.stream_len  # 499 positions a stream a pass: 31 segments of 16 and one of 3
    steps_a_pass = -(-S // 16)
    batches = [b for _, b in zip(range(3 * steps_a_pass), stream)]
    first, second = batches[0], batches[steps_a_pass]
    assert second["reset"] and int(second["offset"][0]) == 0  # positions wrap as over an array...
    assert not np.array_equal(first["tokens"], second["tokens"])  # ... but the tokens are new
    row = np.concatenate([b["tokens"][0].numpy() for b in batches[: 2 * steps_a_pass]])
    stride = c.train.pass_stride  # the second pass starts a chunk (its alignment kept)
    assert stride >= 2000 and stride % c.train.chunk_tokens == 0
    assert np.array_equal(row, c.train[np.concatenate([np.arange(S), stride + np.arange(S)])])
    resumed = c.stream("train", 16, 4, cycle=True, start_batch=steps_a_pass + 5)
    for b, want in zip(resumed, batches[steps_a_pass + 5 :]):
        assert all(torch.equal(b[k], want[k]) for k in want)


def test_fresh_corpus_identity_is_its_draws_and_it_trains(tmp_path):
    from posenc_lab.rundir import corpus_identity
    from posenc_lab.train import train

    a, b = corpus_identity(fresh()), corpus_identity(fresh(seed=1))
    assert a == corpus_identity(fresh()) and a["sha256"] != b["sha256"] and a["n_tokens"]["train"] == 3000
    assert a["sha256"] != corpus_identity(fresh(align=8))["sha256"]
    corpus = ["data.corpus.eval_instances=8", "data.corpus.n_train=4", "data.corpus.fresh=true"]
    results = train(compose_config("train", tiny(tmp_path / "run", tmp_path / "cache", *corpus, steps=2, data="copy")))
    assert results["data"] == "copy" and 0 <= results["test"]["acc"] <= 1
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("train.npy"))  # nothing cached


def test_a_pass_of_one_step_still_reads_new_tokens_every_pass():
    """Streams one segment long: every step is a pass of its own, and each reads the next pass's chunk."""
    c = fresh(train_tokens=4 * 16 + 1)
    stream = c.stream("train", 16, 4, cycle=True)
    assert stream.stream_len == 16
    batches = [b for _, b in zip(range(3), stream)]
    stride = c.train.pass_stride
    for lap, b in enumerate(batches):
        assert b["reset"] and np.array_equal(b["tokens"][0].numpy(), c.train[lap * stride + np.arange(16)])
    assert not np.array_equal(batches[0]["tokens"], batches[1]["tokens"])


def test_a_packed_chunk_starts_with_an_end_token_so_its_first_instance_is_whole():
    """The chunk before cut its last instance: the next chunk opens with the end token every instance follows, so
    copy's first answer is its own input's."""
    c = load_corpus("copy", root="unused", **dict(SMALL, n_symbols=4, fresh=True))
    K, end = c.train.chunk_tokens, len(c.itos) - 1
    for chunk in (1, 2, 7):
        start = chunk * K
        assert c.train[start] == end and not c.side["train"]["loss_mask"][start]
        stretch = np.arange(start, start + 200)
        first = chunk_instances(c, c.train[stretch], c.side["train"]["loss_mask"][stretch], whole=True)[1]
        assert first[1] == first[0]  # copy: the answer is the input
