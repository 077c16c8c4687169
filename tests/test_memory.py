"""The static memory (posenc_lab/memory.py): always M slots with a validity mask, scoring exactly as the memory of
today's growing lists (the explicit ``mems=[...]`` path of the model, kept as the reference) for every scheme, over
several segments from a stream's empty start, with the same-length mask and with an episode reset."""

from __future__ import annotations

import pytest
import torch

from posenc_lab.memory import Memory, Recurrence
from posenc_lab.positional import SCHEME_NAMES
from tests.models import make_model

B, L, M, V = 2, 3, 8, 23
N_SEG = 6  # memory 0, 3, 6, 8, 8 valid... then a reset at RESET
RESET = 4


def _stream(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(V, (B, N_SEG * L + 1), generator=g)
    return x[:, :-1], x[:, 1:]


def _run_both(model, same_length: bool, reset_at: int | None, grads: bool = False):
    """(static, growing) per segment: (token_loss, the gradients of every parameter if asked)."""
    x, y = _stream()
    static, mems = Recurrence(), None
    out_s, out_d = [], []
    params = [p for p in model.parameters() if p.requires_grad]
    for t in range(N_SEG):
        reset = t == 0 or t == reset_at
        offset = torch.full((B,), (t - (reset_at if reset_at is not None and t >= reset_at else 0)) * L)
        seg = dict(offset=offset, same_length=same_length)
        xs, ys = x[:, t * L : (t + 1) * L], y[:, t * L : (t + 1) * L]
        flag = torch.tensor(reset)  # a tensor: read on the device, as training does
        a = static.step(model, xs, ys, reset=flag, **seg)
        b = model(xs, ys, mems=None if reset else mems, **seg)  # today's growing memory
        mems = b.mems
        for out, keep in ((a, out_s), (b, out_d)):
            g = torch.autograd.grad(out.loss, params, allow_unused=True) if grads else ()
            keep.append((out.token_loss.detach(), g))
        assert a.mems.states[0].shape == (B, M, 16), "the memory must keep its shape from the first segment"
        assert int(a.mems.valid.sum()) == b.mems[0].shape[1]
    return out_s, out_d


@pytest.mark.parametrize("name", SCHEME_NAMES)
def test_static_memory_scores_as_the_growing_memory(name):
    model = make_model(name, n_layer=2, mem_len=M, randomize="all")
    for same_length in (False, True):
        static, dynamic = _run_both(model, same_length, reset_at=RESET)
        for t, ((a, _), (b, _)) in enumerate(zip(static, dynamic)):
            torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5, msg=f"{name} segment {t} same_length={same_length}")


@pytest.mark.parametrize("name", SCHEME_NAMES)
def test_static_memory_gradients_equal_the_growing_memory(name):
    model = make_model(name, n_layer=2, mem_len=M, randomize="all").train()
    static, dynamic = _run_both(model, False, reset_at=None, grads=True)
    for t in (0, 1, 3):  # empty, partly filled, full
        for ga, gb in zip(static[t][1], dynamic[t][1]):
            if ga is None or gb is None:
                assert ga is None and gb is None
                continue
            torch.testing.assert_close(ga, gb, atol=1e-5, rtol=1e-4, msg=f"{name} segment {t}")


@pytest.mark.parametrize("name", SCHEME_NAMES)
def test_empty_slots_contribute_nothing_whatever_they_hold(name):
    """Slots not valid may hold anything (states from before a reset): the scores must not move."""
    model = make_model(name, n_layer=2, mem_len=M, randomize="all")
    x, y = _stream()
    full = model(x[:, :M], mems=model.empty_memory(B, M, x.device)).mems
    junk = Memory([s * 50 + 3 for s in full.states], torch.arange(M) >= M - 2)  # 2 valid slots, 6 of junk
    zeros = Memory([s.masked_fill(~junk.valid[:, None], 0.0) for s in junk.states], junk.valid)
    seg = dict(offset=torch.full((B,), 2))
    a = model(x[:, M : M + L], y[:, M : M + L], mems=junk, **seg).token_loss
    b = model(x[:, M : M + L], y[:, M : M + L], mems=zeros, **seg).token_loss
    c = model(x[:, M : M + L], y[:, M : M + L], mems=[s[:, -2:] for s in full.states], **seg).token_loss
    torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(a, c, atol=2e-5, rtol=1e-5)


def test_memory_round_trips_through_its_valid_slots():
    """A checkpoint keeps the valid slots only (the format of every version); loading pads them back to M
    invalid-first slots, and the next segment scores the same."""
    model = make_model("xl", n_layer=2, mem_len=M, randomize="all")
    x, y = _stream()
    rec = Recurrence()
    for t in range(2):
        rec.step(model, x[:, t * L : (t + 1) * L], reset=t == 0)
    saved = rec.memory.valid_states()
    assert [s.shape for s in saved] == [(B, 2 * L, 16)] * 2
    loaded = Memory.of(saved, M)
    assert loaded.valid.tolist() == rec.memory.valid.tolist()
    nxt = dict(offset=torch.full((B,), 2 * L))
    a = model(x[:, 2 * L : 3 * L], y[:, 2 * L : 3 * L], mems=rec.memory, **nxt).token_loss
    b = model(x[:, 2 * L : 3 * L], y[:, 2 * L : 3 * L], mems=loaded, **nxt).token_loss
    torch.testing.assert_close(a, b)
    assert Memory.empty(2, B, M, 16, torch.float32, "cpu").valid_states() == []
    assert Memory.of([torch.ones(B, M + 3, 16)] * 2, M).valid.all()  # a longer memory keeps its newest M
