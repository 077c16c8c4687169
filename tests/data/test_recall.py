"""The recall probe (posenc_lab/data/recall.py): the planted value at its distance,
one value in flight, deterministic, and its evaluation range."""

import numpy as np
import pytest

from posenc_lab.data import load_corpus, make_recall


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
