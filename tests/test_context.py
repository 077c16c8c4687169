"""Evaluation at an exact context length (posenc_lab.context): what RECL and the extrapolation
analysis rely on. The "same length" mask with memory and the sliding window give every scored token
exactly c previous tokens; for relative schemes with one layer both agree token for token, which
also pins the relative shift with memory and the same-length mask."""

from __future__ import annotations

import pytest
import torch

from posenc_lab.context import context_losses, perturbed_losses, stream_losses, stream_rows, window_losses
from posenc_lab.model import MemoryTransformer
from posenc_lab.positional import SCHEME_NAMES
from tests import models
from tests.schemes import GLOBAL_SINUSOID, LEARNED, SHAW, SINUSOID, XL

V = 19


def make_model(name: str, n_layer: int = 1, **cfg) -> MemoryTransformer:
    return models.make_model(name, n_layer, randomize="all", vocab_size=V, **cfg)


@pytest.mark.parametrize("name", [XL, SHAW, SINUSOID, GLOBAL_SINUSOID, LEARNED])
@pytest.mark.parametrize("mode", ["memory", "window"])
def test_every_scored_token_sees_exactly_c_previous_tokens(name, mode):
    """One layer: a token c back changes the loss, one c + 1 back does not (in memory mode the
    memory spans several segments of 4, so the same-length mask is what cuts the context)."""
    model = make_model(name)
    c, start, n = 7, 12, 9
    tokens = torch.randint(V, (2, start + n + 1))
    base = context_losses(model, tokens, c, score_start=start, n_score=n, mode=mode, segment_len=4).loss
    for k in range(n):
        t = start + k  # input index of scored target k
        for back, should_change in ((c, True), (c + 1, False)):
            changed = tokens.clone()
            changed[:, t - back] = (changed[:, t - back] + 1) % V
            loss = context_losses(model, changed, c, score_start=start, n_score=n, mode=mode, segment_len=4).loss
            differs = not torch.allclose(loss[:, k], base[:, k], atol=1e-6)
            assert differs == should_change, (name, mode, k, back)


@pytest.mark.parametrize("name", [XL, SHAW])
@pytest.mark.parametrize("c", [3, 8, 13])
def test_relative_one_layer_memory_equals_sliding_window(name, c):
    """Relative schemes, one layer: memory + same-length mask (through the relative shift, memory
    keys at negative positions) gives the same losses as recomputing each window from scratch."""
    model = make_model(name)
    tokens = torch.randint(V, (3, 40))
    kw = dict(score_start=16, n_score=20, segment_len=5)
    mem = context_losses(model, tokens, c, mode="memory", **kw)
    win = context_losses(model, tokens, c, mode="window", **kw)
    torch.testing.assert_close(mem.loss, win.loss, atol=1e-5, rtol=1e-5)


def test_absolute_memory_differs_from_window():
    """sinusoid with memory carries positions of earlier segments: not a sliding window."""
    model = make_model(SINUSOID)
    tokens = torch.randint(V, (2, 40))
    kw = dict(score_start=16, n_score=20, segment_len=5)
    assert not torch.allclose(
        context_losses(model, tokens, 8, mode="memory", **kw).loss,
        context_losses(model, tokens, 8, mode="window", **kw).loss,
        atol=1e-4,
    )


def test_stream_losses_match_a_manual_segment_loop():
    model = make_model(XL, n_layer=2, mem_len=6)
    tokens = torch.randint(V, (2, 23))
    res = stream_losses(model, tokens, segment_len=6, mem_len=6)
    mems, parts, guesses = None, [], []
    with torch.no_grad():
        for s in range(0, 22, 6):
            e = min(s + 6, 22)
            out = model(tokens[:, s:e], tokens[:, s + 1 : e + 1], mems=mems, offset=s)
            mems = out.mems
            parts.append(out.token_loss)
            guesses.append(out.logits.argmax(-1))
    torch.testing.assert_close(res.loss, torch.cat(parts, 1))
    assert res.offset[0].tolist() == list(range(22))
    # the prediction kept (what the reach's permutation null re-pairs) is the argmax, and `correct` reads it
    assert torch.equal(res.predicted, torch.cat(guesses, 1))
    assert torch.equal(res.correct, res.predicted == tokens[:, 1:])


def test_episode_reset_restarts_offsets():
    model = make_model(GLOBAL_SINUSOID, mem_len=4)
    res = stream_losses(model, torch.randint(V, (1, 21)), segment_len=4, mem_len=4, episode_len=6)
    assert res.offset[0].tolist() == [0, 1, 2, 3, 4, 5] * 3 + [0, 1]


def test_lengths_a_scheme_cannot_serve_fail_before_compute():
    model = make_model(LEARNED)  # table of 64 positions
    tokens = torch.randint(V, (1, 200))
    with pytest.raises(ValueError, match="max_positions"):
        stream_losses(model, tokens, segment_len=80, mem_len=0)
    with pytest.raises(ValueError, match="max_positions"):
        context_losses(model, tokens, 70, score_start=80, n_score=4, mode="window")
    with pytest.raises(ValueError, match="score_start"):
        context_losses(model, tokens, 50, score_start=10, n_score=4)


def test_stream_rows_are_contiguous_and_disjoint():
    data = torch.arange(1000).numpy()
    rows = stream_rows(data, 4, 99)
    assert rows.shape == (4, 100)
    assert (rows[:, 1:] - rows[:, :-1] == 1).all() and rows[1, 0] > rows[0, -1]
    with pytest.raises(ValueError, match="too few"):
        stream_rows(data, 20, 99)


@pytest.mark.parametrize("name", SCHEME_NAMES)
def test_window_losses_equal_a_fresh_window_per_token_and_context(name):
    """One causal pass per window start (context.window_losses) gives, for every scheme, what a fresh window of
    c + 1 inputs per scored token gives (the vanilla sliding window, computed here one window at a time), at
    every c at once, including the scored tokens whose windows reach the row's end."""
    model = make_model(name, n_layer=2)
    tokens = torch.randint(V, (2, 30))
    start, n, contexts = 9, 20, [2, 5, 9]
    got = window_losses(model, tokens, contexts, score_start=start, n_score=n)
    assert sorted(got) == contexts
    with torch.no_grad():
        model.eval()
        for c in contexts:
            for k in range(n):
                i = start + k  # the scored input
                w = tokens[:, i - c : i + 2]  # its c + 1 inputs and the target
                out = model(w[:, :-1], w[:, 1:], mems=None, offset=0, mem_len=0)
                torch.testing.assert_close(got[c].loss[:, k], out.token_loss[:, -1], atol=2e-5, rtol=1e-5)
                assert torch.equal(got[c].correct[:, k], out.logits[:, -1].argmax(-1) == w[:, -1])
            assert (got[c].offset == c).all()
    with pytest.raises(ValueError, match="score_start"):
        window_losses(model, tokens, [10], score_start=start, n_score=n)


def test_reads_offsets_tells_the_schemes_that_count_stream_offsets():
    """global_sinusoid's positions are stream offsets (a window past its training episodes meets positions it never
    saw: the controlled-context dumps leave those windows out); sinusoid resets per segment, xl is relative."""
    from posenc_lab.context import reads_offsets

    assert reads_offsets(make_model(GLOBAL_SINUSOID))
    assert not any(reads_offsets(make_model(name)) for name in (SINUSOID, LEARNED, XL, SHAW))


@pytest.mark.parametrize("n_layer, mem_len", [(1, 8), (2, 8), (2, 0)])
def test_perturbed_context_changes_nothing_past_what_the_model_can_see(n_layer, mem_len):
    # xl with segments of L and memory M sees n_layer M tokens before its segment: replacing the inputs beyond
    # d of the scored block changes its losses exactly nothing for d >= n_layer M, and something just inside it
    L = 8
    model = models.make_model(XL, n_layer=n_layer, mem_len=mem_len, randomize="all")
    torch.manual_seed(1)
    tokens, other = torch.randint(0, 23, (2, 3, 6 * L + 1))
    true, perturbed = perturbed_losses(
        model, tokens, other, range(5 * L + 1), score_start=5 * L, segment_len=L, mem_len=mem_len
    )
    assert true.shape == (3, L)
    assert torch.equal(true, stream_losses(model, tokens, segment_len=L, mem_len=mem_len).loss[:, 5 * L :])
    reach = n_layer * mem_len
    for d, loss in perturbed.items():
        assert torch.equal(loss, true) == (d >= reach), d
    with pytest.raises(ValueError, match=r"distances must be in 0..score_start \(40\), got \[41\]"):
        perturbed_losses(model, tokens, other, [41], score_start=5 * L, segment_len=L, mem_len=mem_len)
