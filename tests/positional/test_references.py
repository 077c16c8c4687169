"""Every scheme whose fast path is not a per-pair formula against its naive per-pair reference (tests/positional/
naive.py, written from docs/SCHEMES.md), forward and backward (q, k, v, the layer input and every parameter), with
and without memory and the same-length mask; the bias schemes through the fused path too."""

from __future__ import annotations

import pytest
import torch

from posenc_lab.positional import AttentionInputs
from tests.positional.naive import (
    BIAS,
    DATA_DEPENDENT,
    REFERENCED,
    _seed,  # noqa: F401 - an autouse fixture
    assert_equals_naive,
    naive_attend,
    new_inputs,
    new_scheme,
)
from tests.positional.test_fused import (
    reference,  # noqa: F401 (a fixture)
)
from tests.positional.test_schemes import MASKS, make_positions, make_scheme, qkv


@pytest.mark.parametrize("L, M, same_length", MASKS)
@pytest.mark.parametrize("name", REFERENCED)
def test_each_equals_its_naive_reference_forward_and_backward(name, L, M, same_length):
    """With and without memory (M = 0, M < L, M = L, M > L) and the same-length mask; the unfused path (fox: SDPA
    with its [B, H, L, N] bias)."""
    scheme = (make_scheme(name) if name in DATA_DEPENDENT else new_scheme(name)).train()
    scheme.attention_impl = "unfused"
    pos = make_positions(L, M, same_length)
    if name in DATA_DEPENDENT:
        q, k, v, x = new_inputs(L, M)
        assert_equals_naive(name, scheme, q, k, v, pos, x)
    else:
        q, k, v = (t.requires_grad_() for t in qkv(L, M))
        assert_equals_naive(name, scheme, q, k, v, pos)


@pytest.mark.parametrize("L, M, same_length", [(5, 0, False), (4, 9, False), (5, 3, True)])
@pytest.mark.parametrize("name", BIAS)
def test_bias_schemes_fused_path_equals_naive(reference, name, L, M, same_length):  # noqa: F811
    """KERPLE, Sandwich and FIRE through flex_attention (uncompiled reference on CPU): the same score_mods
    that CUDA compiles, their tables' and FIRE's MLP gradients included."""
    scheme = new_scheme(name).train()
    scheme.attention_impl = "fused"
    q, k, v = (x.requires_grad_() for x in qkv(L, M))
    assert_equals_naive(name, scheme, q, k, v, make_positions(L, M, same_length))


@pytest.mark.slow  # compiles flex_attention for the CPU: 15-60 s per scheme on 2 shared cores
@pytest.mark.parametrize("name", BIAS)
def test_compiled_cpu_forward_equals_naive(name):
    """What attention_impl=fused runs in CPU evaluation: the compiled kernel of each score_mod, no gradient."""
    scheme, (L, M) = new_scheme(name), (5, 9)
    scheme.attention_impl = "fused"
    pos, (q, k, v) = make_positions(L, M, same_length=True), qkv(L, M)
    with torch.no_grad():
        want = naive_attend(name, scheme, 1, q, k, v, pos)
        torch.testing.assert_close(scheme.attend(AttentionInputs(1, q, k, pos, v=v)), want, atol=1e-5, rtol=1e-5)
