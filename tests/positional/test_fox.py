"""FoX (posenc_lab/positional/fox.py): the fused path against the naive reference,
the path it takes, and what the paper leaves open (the gate's start, the unused oldest gate)."""

from __future__ import annotations

import pytest
import torch

from posenc_lab.positional import AttentionInputs, fused
from tests.positional.naive import (
    _seed,  # noqa: F401 - an autouse fixture
    assert_equals_naive,
    naive_fox,
    new_inputs,
)
from tests.positional.test_fused import (
    reference,  # noqa: F401 (a fixture)
)
from tests.positional.test_schemes import B, H, inputs, make_positions, make_scheme, qkv
from tests.schemes import FOX


@pytest.mark.parametrize("L, M, same_length", [(5, 0, False), (4, 9, False), (5, 3, True)])
def test_fox_fused_path_equals_naive(reference, L, M, same_length):  # noqa: F811
    """FoX through flex_attention (its uncompiled reference on CPU): the score_mod that CUDA compiles, reading two
    entries of the captured cumulative gates per pair, their gradient (so the gate's) included."""
    scheme = make_scheme(FOX).train()
    scheme.attention_impl = "fused"
    q, k, v, x = new_inputs(L, M)
    assert_equals_naive(FOX, scheme, q, k, v, make_positions(L, M, same_length), x)


@pytest.mark.slow  # compiles flex_attention for the CPU: 15-60 s on 2 shared cores
def test_fox_compiled_cpu_forward_equals_naive():
    """What attention_impl=fused runs in CPU evaluation: the compiled kernel with the cumulative gates captured
    (no gradient: torch refuses flex_attention's backward on CPU; the CUDA test of tests/positional/test_fused.py runs
    it)."""
    scheme = make_scheme(FOX).eval()
    scheme.attention_impl = "fused"
    q, k, v, x = (t.detach() for t in new_inputs(5, 9))
    pos = make_positions(5, 9, same_length=True)
    with torch.no_grad():
        torch.testing.assert_close(
            scheme.attend(AttentionInputs(1, q, k, pos, v=v, context=x)),
            naive_fox(scheme, 1, q, k, v, pos, x),
            atol=1e-5,
            rtol=1e-5,
        )


def test_fox_takes_the_fused_path_on_cuda_and_sdpa_on_cpu(monkeypatch):
    scheme = make_scheme(FOX)
    on_cuda = type("Q", (), {"device": torch.device("cuda")})()
    assert scheme.fused_from_keys == 0 and fused.use_fused(scheme, on_cuda, torch.empty(1, 1, 64, 1), 0.0)
    monkeypatch.setattr(fused, "_flex", lambda: pytest.fail("flex_attention called on CPU"))
    q, k, v, x = new_inputs(5, 3)
    scheme.attend(AttentionInputs(1, q, k, make_positions(5, 3), v=v, context=x)).sum().backward()
    assert scheme.gate[1].weight.grad.abs().sum() > 0


def test_fox_gate_starts_as_the_authors():
    """The model's initialisation gives the gate bias 0 and weights N(0, 0.02): f starts near 1/2."""
    from tests.models import make_model

    model = make_model(FOX, n_layer=2, randomize=None, d_model=64, n_head=4)
    for gate in model.scheme.gate:
        assert not gate.bias.any() and abs(gate.weight.std().item() - 0.02) < 0.004


def test_fox_oldest_key_gate_is_never_used_and_a_closed_gate_cuts_the_past():
    """The gate of key 0 enters no pair (the sum runs over j+1..i); a gate f -> 0 at token t hides every key
    before t from every query after it."""
    scheme, pos = make_scheme(FOX), make_positions(4, 4)
    x = inputs(4, 4)
    with torch.no_grad():
        bias = scheme.score_bias(0, pos, x).dense(pos)
        y = x.clone()
        y[:, 0] += 5.0
        torch.testing.assert_close(scheme.score_bias(0, pos, y).dense(pos), bias)
        scheme.gate[0].bias.fill_(-1e4)  # f ~ 0 everywhere: only the diagonal survives
        q, k, v = qkv(4, 4)
        probs = scheme.attention_probs(AttentionInputs(0, q, k, pos, context=x))
    own = torch.arange(4)[:, None] + 4 == torch.arange(8)[None, :]
    torch.testing.assert_close(probs[..., own], torch.ones(B, H, 4))


def test_documented_options_exist():
    from posenc_lab.positional import scheme_options

    assert scheme_options(FOX) == {}


def test_without_the_layer_input_it_says_what_it_needs():
    q, k, v = qkv(5, 3)
    with pytest.raises(ValueError, match=rf"{FOX}: .*layer's input.*context"):
        make_scheme(FOX).attend(AttentionInputs(0, q, k, make_positions(5, 3), v=v))
