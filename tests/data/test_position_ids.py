"""Position ids the data gives (``data.corpus.position_ids``; read by ``model.data_positions``): Abacus ids as McLeish
et al.'s code counts them, coupled ids that line up the digits one step of the sum reads (Cho et al.), one shift per
training instance and none at test, the same tokens with or without them, and the streams hand the model the ids of
its inputs."""

from __future__ import annotations

import pickle
import re

import numpy as np
import pytest
import torch

from posenc_lab.data import load_corpus
from posenc_lab.data.lengthgen import task_instances
from posenc_lab.data.streams import SegmentStream

SMALL = dict(n_train=4, train_tokens=3000, eval_instances=16, max_factor=2)


def abacus_reference(tokens: torch.Tensor, digits: torch.Tensor) -> torch.Tensor:
    """McLeish et al.'s rule, written from their description: every maximal run of consecutive digit tokens numbered
    1, 2, ... from its first token; 0 for any other token. tokens: [B, N]."""
    is_digit = torch.isin(tokens, digits)
    out = torch.zeros_like(tokens)
    for b in range(tokens.shape[0]):
        count = 0
        for t in range(tokens.shape[1]):
            count = count + 1 if is_digit[b, t] else 0
            out[b, t] = count
    return out


@pytest.mark.parametrize("task", ["reverse", "addition", "addition_reversed"])
@pytest.mark.parametrize("align", [0, 16])
def test_abacus_ids_number_each_run_of_symbols_from_its_first(task, align, tmp_path):
    S = 10 if "addition" in task else 4
    c = load_corpus(task, root=tmp_path, **SMALL, n_symbols=S, position_ids=True, align_to_segment=align)
    for split in ("val", "test"):  # test instances are unshifted: the rule itself
        tokens = torch.tensor(np.array(c.split(split)), dtype=torch.long)[None]
        ids = np.asarray(c.side[split]["position_ids"]["abacus"])
        assert np.array_equal(ids, abacus_reference(tokens, torch.arange(S))[0].numpy())
    assert set(c.side["val"]["position_ids"]) == ({"abacus", "coupling"} if "addition" in task else {"abacus"})


def cho_coupled_ids(n: int, reversed_numbers: bool) -> list[int]:
    """Cho et al.'s coupled ids of an n-digit addition with zero-padded operands (their start 1): with end = n + 2,
    each operand's digits take end - n .. end - 1 and the operator after it end; the sum's n + 1 digits end - n - 1 ..
    end - 1; written reversed, a number's ids are reversed with it. The end token: none (0)."""
    end = 1 + n + 1
    operand, total = list(range(end - n, end)), list(range(end - n - 1, end))
    if reversed_numbers:
        operand, total = operand[::-1], total[::-1]
    return operand + [end] + operand + [end] + total + [0]


@pytest.mark.parametrize("task", ["addition", "addition_reversed"])
def test_coupled_ids_are_the_authors_and_line_up_each_column_of_the_sum(task, tmp_path):
    c = load_corpus(task, root=tmp_path, **SMALL, position_ids=True)
    for n, (rows, _, ids) in task_instances(c, "test").items():
        assert (ids["coupling"][:, 0] == 0).all()  # the end token before a packed instance: no id
        assert ids["coupling"][0, 1:].tolist() == cho_coupled_ids(n, task == "addition_reversed")
        for row, coupled in zip(rows[:, 1:], ids["coupling"][:, 1:]):
            digits = row < 10
            carry = 0
            for p in sorted(set(coupled[digits].tolist()), reverse=True):  # from the units (the largest id) up
                column = row[digits & (coupled == p)].tolist()  # a's digit, b's digit, the sum's, in reading order
                if len(column) == 1:  # the sum's last digit: the carry out
                    assert column == [carry]
                    continue
                a, b, total = column
                assert total == (a + b + carry) % 10
                carry = (a + b + carry) // 10


@pytest.mark.parametrize("fresh", [False, True])
def test_each_training_instance_shifts_its_ids_by_one_draw_and_test_instances_by_none(fresh, tmp_path):
    options = dict(SMALL, align_to_segment=16, fresh=fresh)
    plain = load_corpus("addition_reversed", root=tmp_path, **options)
    c = load_corpus("addition_reversed", root=tmp_path, **options, position_ids=True, position_shift=20)
    tokens = np.asarray(c.train[:3000])
    assert np.array_equal(tokens, np.asarray(plain.train[:3000]))  # the shifts draw nothing the tokens draw
    assert "position_ids" not in plain.side["train"]
    ids = np.asarray(c.side["train"]["position_ids"]["abacus"][:3000])
    starts = np.flatnonzero(np.arange(3000) % 16 == 0)  # aligned: an instance (or pads) starts every block
    shifts = []
    for start in starts[:-2]:
        block, got = tokens[start : start + 16], ids[start : start + 16]
        if block[0] >= 10:  # a block of pads
            continue
        n = int(np.flatnonzero(block == 10)[0])  # the "+" after the first operand's n digits
        unshifted = np.r_[1 : n + 1, 0, 1 : n + 1, 0, 1 : n + 2, 0]
        k = got[0] - 1
        assert np.array_equal(got[: len(unshifted)], np.where(unshifted > 0, unshifted + k, 0))  # one k an instance
        assert (got[len(unshifted) :] == 0).all()  # pads: no id
        shifts.append(int(k))
    assert min(shifts) >= 0 and max(shifts) <= 20 and len(set(shifts)) > 10
    largest = max(int(np.asarray(c.side[s]["position_ids"]["abacus"]).max()) for s in ("val", "test"))
    assert largest == 2 * 4 + 1  # the longest test sum, unshifted
    # the largest of each kind: a training sum of 4 digits + 1 (abacus) or its operators (coupling, n + 2), shifted
    assert c.position_id_max == {"abacus": 4 + 1 + 20, "coupling": 4 + 2 + 20}


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(position_shift=3), "data.corpus.position_shift=3 shifts position ids the corpus does not give"),
        (dict(position_ids=True, position_shift=-1), "data.corpus.position_shift must be an integer >= 0, got -1"),
    ],
)
def test_a_bad_shift_is_one_line_before_any_work(options, message, tmp_path):
    with pytest.raises(ValueError, match=re.escape(message)) as e:
        load_corpus("addition", root=tmp_path, **SMALL, **options)
    assert "\n" not in str(e.value) and not any(tmp_path.iterdir())


def test_without_position_ids_a_corpus_keeps_its_cache_key(tmp_path):
    load_corpus("copy", root=tmp_path, **SMALL)
    load_corpus("copy", root=tmp_path, **SMALL, position_ids=False)
    load_corpus("copy", root=tmp_path, **SMALL, position_ids=True)
    folders = {p.parent for p in tmp_path.rglob("train.npy")}
    assert len(folders) == 2  # off (either way of saying it) is the corpus of before the option; on is another


@pytest.mark.parametrize("fresh", [False, True])
def test_a_stream_hands_over_the_ids_of_its_inputs_and_pickles_them(fresh, tmp_path):
    c = load_corpus("addition", root=tmp_path, **SMALL, fresh=fresh, position_ids=True, position_shift=5)
    stream = c.stream("train", segment_len=8, n_streams=3, cycle=True)
    ids, tokens = c.side["train"]["position_ids"], c.train
    for step, batch in zip(range(5), stream):
        starts = stream._stream_starts + 8 * step
        at = starts[:, None] + np.arange(8)
        assert np.array_equal(batch["tokens"].numpy(), np.asarray(tokens[at]))
        for kind in ("abacus", "coupling"):  # the ids of the inputs, not of the targets
            assert np.array_equal(batch["position_ids"][kind].numpy(), np.asarray(ids[kind][at]))
    first, again = next(iter(stream)), next(iter(pickle.loads(pickle.dumps(stream))))  # as a DataLoader worker
    assert all(torch.equal(first["position_ids"][k], again["position_ids"][k]) for k in ("abacus", "coupling"))
    plain = SegmentStream(np.asarray(tokens[:3000]), 8, 3)
    assert "position_ids" not in next(iter(plain))  # a corpus without ids: the batch has none


@pytest.mark.parametrize("fresh", [False, True])
def test_the_corpus_hash_covers_the_ids_and_is_the_same_in_another_process(fresh, tmp_path):
    """A run's record holds its corpus's hash: a resumed run (another process) must compute the same one."""
    import subprocess
    import sys

    from posenc_lab.rundir import corpus_identity

    options = dict(SMALL, fresh=fresh, position_ids=True, position_shift=2)
    here = corpus_identity(load_corpus("addition", root=tmp_path, **options))["sha256"]
    code = (
        "import sys; from posenc_lab.data import load_corpus; from posenc_lab.rundir import corpus_identity; "
        f"print(corpus_identity(load_corpus('addition', root=sys.argv[1], **{options!r}))['sha256'])"
    )
    there = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    assert there.stdout.strip() == here
    other = corpus_identity(load_corpus("addition", root=tmp_path, **{**options, "position_shift": 3}))["sha256"]
    plain = corpus_identity(
        load_corpus("addition", root=tmp_path, **{**options, "position_ids": False, "position_shift": 0})
    )
    assert len({here, other, plain["sha256"]}) == 3  # the ids (their shifts) are part of what the hash covers
